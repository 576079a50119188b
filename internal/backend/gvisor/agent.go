package gvisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Inside a gVisor sandbox the agent cannot be handed a host socket as a
// file descriptor; it listens on a unix socket in a host directory bound
// into the sandbox (runsc --host-uds=create), one directory per sandbox,
// which only root can reach on the host.
const (
	agentBin    = namespaces.CodeDir + "/bin/airlock"
	agentRunDir = namespaces.CodeDir + "/run"
)

// AgentSandbox is a long-lived gVisor sandbox running the agent.
type AgentSandbox struct {
	runsc  string
	b      *bundle
	runDir string
	run    *exec.Cmd
	// failure is what runsc said if it failed; read after done.
	failure *runscFailure
	done    chan struct{}
}

// StartAgent starts a gVisor sandbox whose command is the airlock agent.
func StartAgent(runsc string, p policy.Policy, log io.Writer) (*AgentSandbox, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		return nil, err
	}
	b, err := newBundle(&p)
	if err != nil {
		return nil, err
	}
	s := &AgentSandbox{runsc: runsc, b: b, runDir: filepath.Join(StateDir, "agents", b.id), failure: &runscFailure{}, done: make(chan struct{})}
	// The agent, the sandbox's uid 1000, creates its socket in runDir; on
	// the host that uid is 1000 too (gVisor's gofer does not remap), and
	// runDir sits in root's 0700 state directory, out of any host user's
	// reach.
	if err := os.MkdirAll(s.runDir, 0o700); err != nil {
		b.remove("")
		return nil, err
	}
	if err := os.Chown(s.runDir, sandboxUID, sandboxGID); err != nil {
		b.remove("")
		return nil, err
	}
	p.Env = append(p.Env, agentproto.SocketEnv+"="+agentRunDir+"/agent.sock")
	spec := &namespaces.Spec{Policy: p, Argv: []string{agentBin, agentproto.AgentArg}}
	err = writeBundle(b, spec,
		specs.Mount{Destination: agentBin, Type: "bind", Source: self, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: agentRunDir, Type: "bind", Source: s.runDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
	if err != nil {
		b.remove("")
		return nil, err
	}
	// Attached, as in Run: runsc is the sandbox's parent for its whole
	// life, and killing runsc kills the sandbox.
	s.run = runscFlags(runsc, b.id, []string{"--host-uds", "create", "--log-fd", "3"}, "run", "--bundle", b.dir, b.id)
	errW, err := s.failure.pipe()
	if err != nil {
		b.remove("")
		return nil, err
	}
	s.run.ExtraFiles = []*os.File{errW}
	// The sandbox keeps its stdio for its whole life: hand it a pipe of our
	// own, an *os.File, so that nothing waits for it to close.
	logR, logW, err := os.Pipe()
	if err != nil {
		errW.Close()
		b.remove("")
		return nil, err
	}
	go func() { io.Copy(log, logR); logR.Close() }()
	s.run.Stdout, s.run.Stderr = logW, logW
	s.run.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	err = s.run.Start()
	logW.Close()
	errW.Close()
	if err != nil {
		b.remove("")
		return nil, fmt.Errorf("start runsc: %w", err)
	}
	go func() {
		s.run.Wait()
		close(s.done)
	}()
	return s, nil
}

// Dial connects to the agent, waiting for it to listen (it starts after
// the sandbox does).
func (s *AgentSandbox) Dial(ctx context.Context) (net.Conn, error) {
	sock := filepath.Join(s.runDir, "agent.sock")
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sock)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-s.done:
			if msg := s.failure.wait(); msg != "" {
				return nil, fmt.Errorf("the sandbox ended: runsc: %s", msg)
			}
			return nil, fmt.Errorf("the sandbox ended: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Done is closed when the sandbox has ended.
func (s *AgentSandbox) Done() <-chan struct{} { return s.done }

// Kill ends the sandbox: runsc is its parent, and an attached sandbox dies
// with it (Pdeathsig); Wait then kills whatever is left in its cgroup. A
// paused sandbox is thawed, or the signal would wait for it.
func (s *AgentSandbox) Kill() {
	s.run.Process.Kill()
	s.b.cg.Freeze(false)
}

// Pause stops the whole sandbox, gVisor's kernel included, where it is
// (its cgroup's freezer), until Resume.
func (s *AgentSandbox) Pause() error { return s.b.cg.Freeze(true) }

// Resume restarts a paused sandbox.
func (s *AgentSandbox) Resume() error { return s.b.cg.Freeze(false) }

// Wait waits for the sandbox to end and removes all of it.
func (s *AgentSandbox) Wait() error {
	<-s.done
	return s.b.remove(s.runsc)
}

// MemoryUsage is the sandbox's memory use, gVisor's own included.
func (s *AgentSandbox) MemoryUsage() int64 {
	st, _ := s.b.cg.Stats()
	return st.Memory
}

// CPUUsage is the CPU time the sandbox has used so far, gVisor's own
// included.
func (s *AgentSandbox) CPUUsage() time.Duration {
	st, _ := s.b.cg.Stats()
	return st.CPU
}
