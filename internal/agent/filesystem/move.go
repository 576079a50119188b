package filesystem

import (
	"context"
	"net/http"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// Move renames a path, making the destination's missing parents.
func (s *Service) Move(ctx context.Context, r *http.Request, req *moveRequest) (*entryResponse, error) {
	id, err := s.users.Who(r)
	if err != nil {
		return nil, err
	}
	src, dst := id.Resolve(req.Source), id.Resolve(req.Destination)
	var e *agentproto.EntryInfo
	err = s.users.As(id, func() error {
		if _, err := os.Lstat(src); err != nil {
			return PathError(src, err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return PathError(filepath.Dir(dst), err)
		}
		if err := os.Rename(src, dst); err != nil {
			return PathError(dst, err)
		}
		e, err = statEntry(dst)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &entryResponse{Entry: e}, nil
}
