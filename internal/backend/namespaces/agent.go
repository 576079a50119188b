package namespaces

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// agentPath is where the airlock binary appears inside a sandbox.
const agentPath = codeDir + "/bin/airlock"

// AgentSandbox is a long-lived sandbox whose command is the airlock agent,
// reachable through a unix socket on the host that only root can open.
type AgentSandbox struct {
	*Sandbox
	socket string
}

// StartAgent starts a sandbox running the agent. The daemon creates the
// listening socket and hands it to the agent as its fd 3, so the agent
// never needs a path of the host, and the sandbox's code never sees one.
// The agent's log (its stderr) goes to log.
func StartAgent(p policy.Policy, log io.Writer) (*AgentSandbox, error) {
	if err := prepareStateDir(); err != nil {
		return nil, err
	}
	dir := filepath.Join(StateDir, "agents")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	id, err := newID()
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, id+".sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	// The socket file outlives this listener: the sandbox keeps its copy
	// of the listening socket, and the file is removed with the sandbox.
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	ln.Close()
	if err != nil {
		os.Remove(sock)
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	defer lf.Close()
	sb, err := Start(&Spec{
		Policy:     p,
		Argv:       []string{agentPath, agentproto.AgentArg},
		Stderr:     log,
		Stdout:     log,
		ExtraFiles: []*os.File{lf},
		SelfMount:  agentPath,
		id:         id,
		live:       true,
	})
	if err != nil {
		os.Remove(sock)
		return nil, err
	}
	return &AgentSandbox{Sandbox: sb, socket: sock}, nil
}

// Dial connects to the agent.
func (s *AgentSandbox) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", s.socket)
}

// Wait waits for the sandbox to end and removes all of it, its socket too.
func (s *AgentSandbox) Wait() (*Result, error) {
	res, err := s.Sandbox.Wait()
	os.Remove(s.socket)
	return res, err
}

// MemoryUsage is the sandbox's current memory use in bytes (0 if unknown).
func (s *AgentSandbox) MemoryUsage() int64 {
	st, _ := s.cg.stats()
	return st.Memory
}

// CPUUsage is the CPU time the sandbox has used so far (0 if unknown).
func (s *AgentSandbox) CPUUsage() time.Duration {
	st, _ := s.cg.stats()
	return st.CPU
}
