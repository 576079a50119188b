package filesystem

import (
	"context"
	"net/http"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// maxListEntries bounds one ListDir answer; a sandbox can hold millions of
// files and the answer is one JSON message.
const maxListEntries = 100_000

// ListDir lists a directory, to req.Depth levels (one at least).
func (s *Service) ListDir(ctx context.Context, r *http.Request, req *agentproto.ListDirRequest) (*agentproto.ListDirResponse, error) {
	id, err := s.users.Who(r)
	if err != nil {
		return nil, err
	}
	var resp *agentproto.ListDirResponse
	err = s.users.As(id, func() (err error) { resp, err = listDir(ctx, id.Resolve(req.Path), req, maxListEntries); return err })
	return resp, err
}

// listDir lists root as req asks, refusing to list more than max entries.
func listDir(ctx context.Context, root string, req *agentproto.ListDirRequest, max int) (*agentproto.ListDirResponse, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, PathError(root, err)
	}
	if !fi.IsDir() {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "path '%s' is not a directory", root)
	}
	depth := int(req.Depth)
	if depth < 1 {
		depth = 1
	}
	resp := &agentproto.ListDirResponse{Entries: []*agentproto.EntryInfo{}}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		des, err := os.ReadDir(dir)
		if err != nil {
			return PathError(dir, err)
		}
		for _, de := range des {
			if err := ctx.Err(); err != nil {
				return err
			}
			if len(resp.Entries) >= max {
				return rpc.Errorf(agentproto.CodeResourceExhausted, "more than %d entries under '%s'", max, root)
			}
			p := filepath.Join(dir, de.Name())
			info, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			resp.Entries = append(resp.Entries, Entry(p, info))
			if de.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, err
	}
	return resp, nil
}
