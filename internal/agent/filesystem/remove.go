package filesystem

import (
	"context"
	"net/http"
	"os"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
)

// Remove removes a path and all it holds. As envd: removing what is not
// there succeeds.
func (s *Service) Remove(ctx context.Context, r *http.Request, req *pathRequest) (*rpc.Empty, error) {
	id, err := s.users.Who(r)
	if err != nil {
		return nil, err
	}
	p := id.Resolve(req.Path)
	err = s.users.As(id, func() error {
		if err := os.RemoveAll(p); err != nil {
			return PathError(p, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &rpc.Empty{}, nil
}
