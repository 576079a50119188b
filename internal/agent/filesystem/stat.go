package filesystem

import (
	"context"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Stat describes a path (a link itself, with its target).
func (s *Service) Stat(ctx context.Context, r *http.Request, req *pathRequest) (*entryResponse, error) {
	id, err := s.users.Who(r)
	if err != nil {
		return nil, err
	}
	var e *agentproto.EntryInfo
	if err := s.users.As(id, func() (err error) { e, err = statEntry(id.Resolve(req.Path)); return err }); err != nil {
		return nil, err
	}
	return &entryResponse{Entry: e}, nil
}
