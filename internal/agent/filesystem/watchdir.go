package filesystem

import (
	"context"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
)

type watchDirResponse struct {
	Start      *rpc.Empty       `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *rpc.Empty       `json:"keepalive,omitempty"`
}

// WatchDir streams the changes under a directory until the client stops
// watching.
func (s *Service) WatchDir(ctx context.Context, r *http.Request, req *watchRequest, st *rpc.Stream[watchDirResponse]) error {
	events := make(chan filesystemEvent, 1024)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := newWatcher(s.users.User().Resolve(req.Path), req, func(ev filesystemEvent) {
		select {
		case events <- ev:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return err
	}
	defer w.Close()
	if err := st.Send(&watchDirResponse{Start: &rpc.Empty{}}); err != nil {
		return err
	}
	ka := time.NewTicker(rpc.KeepaliveInterval(r))
	defer ka.Stop()
	for {
		select {
		case ev := <-events:
			if err := st.Send(&watchDirResponse{Filesystem: &ev}); err != nil {
				return err
			}
		case <-ka.C:
			if err := st.Send(&watchDirResponse{Keepalive: &rpc.Empty{}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil // the client stopped watching
		}
	}
}
