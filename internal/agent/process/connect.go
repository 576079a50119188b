package process

import (
	"context"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type connectRequest struct {
	Process *selector `json:"process"`
}

// Connect attaches another stream to a running process: its start, then
// its events from now on.
func (s *Service) Connect(ctx context.Context, r *http.Request, req *connectRequest, st *rpc.Stream[agentproto.StartResponse]) error {
	p, err := s.find(req.Process)
	if err != nil {
		return err
	}
	sub, err := p.subscribe()
	if err != nil {
		return err
	}
	return streamEvents(ctx, r, p, sub, st)
}
