// Package filesystem serves envd's filesystem.Filesystem service: the
// sandbox's files and directories as the request's user sees them, and
// watches on them.
//
// The agent runs inside the sandbox, after pivot_root: every path it
// touches is a path of the sandbox, and no symlink planted by sandbox
// code can lead to a host file, because no host file is reachable from
// here.
package filesystem

import (
	"net/http"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Service serves one sandbox's file system.
type Service struct {
	users identity.Users

	mu       sync.Mutex
	watchers map[string]*polledWatcher
}

// New returns a service that acts for users.
func New(users identity.Users) *Service {
	return &Service{users: users, watchers: map[string]*polledWatcher{}}
}

// Register adds the service's procedures to mux, and the daemon's
// private DiskPath.
func (s *Service) Register(mux *http.ServeMux) {
	mux.Handle("/filesystem.Filesystem/Stat", rpc.Unary(s.Stat))
	mux.Handle("/filesystem.Filesystem/MakeDir", rpc.Unary(s.MakeDir))
	mux.Handle("/filesystem.Filesystem/Move", rpc.Unary(s.Move))
	mux.Handle(agentproto.ListDirProcedure, rpc.Unary(s.ListDir))
	mux.Handle("/filesystem.Filesystem/Remove", rpc.Unary(s.Remove))
	mux.Handle("/filesystem.Filesystem/WatchDir", rpc.ServerStream(s.WatchDir))
	mux.Handle("/filesystem.Filesystem/CreateWatcher", rpc.Unary(s.CreateWatcher))
	mux.Handle("/filesystem.Filesystem/GetWatcherEvents", rpc.Unary(s.GetWatcherEvents))
	mux.Handle("/filesystem.Filesystem/RemoveWatcher", rpc.Unary(s.RemoveWatcher))
	mux.HandleFunc("GET "+agentproto.DiskPath, s.Disk)
}

type pathRequest struct {
	Path string `json:"path"`
}

type entryResponse struct {
	Entry *agentproto.EntryInfo `json:"entry"`
}
