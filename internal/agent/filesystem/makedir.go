package filesystem

import (
	"context"
	"net/http"
	"os"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// MakeDir makes a directory and its missing parents.
func (s *Service) MakeDir(ctx context.Context, r *http.Request, req *pathRequest) (*entryResponse, error) {
	id, err := s.users.Who(r)
	if err != nil {
		return nil, err
	}
	p := id.Resolve(req.Path)
	var e *agentproto.EntryInfo
	err = s.users.As(id, func() error {
		if fi, err := os.Stat(p); err == nil {
			if fi.IsDir() {
				return rpc.Errorf(agentproto.CodeAlreadyExists, "directory '%s' already exists", p)
			}
			return rpc.Errorf(agentproto.CodeInvalidArgument, "path '%s' already exists and is not a directory", p)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return PathError(p, err)
		}
		e, err = statEntry(p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &entryResponse{Entry: e}, nil
}
