// Package process serves envd's process.Process service: commands the
// agent starts for a sandbox's user, which clients attach to, feed,
// signal and list.
package process

import (
	"net/http"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agent/environ"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"golang.org/x/sys/unix"
)

// Service holds the processes the agent started, by pid.
type Service struct {
	users identity.Users
	env   *environ.Env

	mu sync.Mutex
	m  map[uint32]*process
}

// New returns a service that starts processes for users with env.
func New(users identity.Users, env *environ.Env) *Service {
	return &Service{users: users, env: env, m: map[uint32]*process{}}
}

// Register adds the service's procedures to mux.
func (s *Service) Register(mux *http.ServeMux) {
	mux.Handle(agentproto.StartProcedure, rpc.ServerStream(s.Start))
	mux.Handle("/process.Process/Connect", rpc.ServerStream(s.Connect))
	mux.Handle("/process.Process/List", rpc.Unary(s.List))
	mux.Handle("/process.Process/SendInput", rpc.Unary(s.SendInput))
	mux.Handle("/process.Process/SendSignal", rpc.Unary(s.SendSignal))
	mux.Handle("/process.Process/CloseStdin", rpc.Unary(s.CloseStdin))
	mux.Handle("/process.Process/Update", rpc.Unary(s.Update))
	mux.Handle("/process.Process/StreamInput", rpc.Unary(s.StreamInput))
	mux.HandleFunc("POST "+agentproto.RunPath, s.RunOnce)
}

// processInfo is a process as List reports it.
type processInfo struct {
	Config *agentproto.ProcessConfig `json:"config,omitempty"`
	Pid    uint32                    `json:"pid,omitempty"`
	Tag    *string                   `json:"tag,omitempty"`
}

// selector names a process by pid or by tag.
type selector struct {
	Pid *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

// find returns the process sel names.
func (s *Service) find(sel *selector) (*process, error) {
	if sel == nil || (sel.Pid == nil && sel.Tag == nil) {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "no process selected")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid, p := range s.m {
		if (sel.Pid != nil && *sel.Pid == pid) || (sel.Tag != nil && p.info.Tag != nil && *sel.Tag == *p.info.Tag) {
			return p, nil
		}
	}
	if sel.Pid != nil {
		return nil, rpc.Errorf(agentproto.CodeNotFound, "process with pid %d not found", *sel.Pid)
	}
	return nil, rpc.Errorf(agentproto.CodeNotFound, "process with tag %q not found", *sel.Tag)
}

func (s *Service) add(p *process) {
	s.mu.Lock()
	s.m[p.info.Pid] = p
	s.mu.Unlock()
}

func (s *Service) remove(p *process) {
	s.mu.Lock()
	delete(s.m, p.info.Pid)
	s.mu.Unlock()
}

// Close kills every process the service started, with its group. In a
// sandbox nothing needs it (the sandbox's end kills them all); an agent
// in a process that outlives its sandbox (the fake backend's) does.
func (s *Service) Close() {
	s.mu.Lock()
	procs := make([]*process, 0, len(s.m))
	for _, p := range s.m {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.signal(unix.SIGKILL)
	}
}
