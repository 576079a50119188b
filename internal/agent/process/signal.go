package process

import (
	"context"
	"net/http"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type sendSignalRequest struct {
	Process *selector `json:"process"`
	Signal  string    `json:"signal"`
}

// SendSignal sends SIGKILL or SIGTERM (the two the protocol names) to a
// process's group.
func (s *Service) SendSignal(ctx context.Context, r *http.Request, req *sendSignalRequest) (*rpc.Empty, error) {
	p, err := s.find(req.Process)
	if err != nil {
		return nil, err
	}
	var sig unix.Signal
	switch req.Signal {
	case "SIGNAL_SIGKILL", "9":
		sig = unix.SIGKILL
	case "SIGNAL_SIGTERM", "15":
		sig = unix.SIGTERM
	default:
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "unsupported signal %q", req.Signal)
	}
	if err := p.signal(sig); err != nil {
		return nil, rpc.Errorf(agentproto.CodeInternal, "signal process %d: %v", p.info.Pid, err)
	}
	return &rpc.Empty{}, nil
}
