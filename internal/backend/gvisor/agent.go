package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

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
	// AgentSocketEnv tells the agent where to listen instead of fd 3.
	AgentSocketEnv = "AIRLOCK_AGENT_SOCKET"
)

// AgentSandbox is a long-lived gVisor sandbox running the agent.
type AgentSandbox struct {
	runsc, id, bundle, runDir string
	lock                      *os.File
	done                      chan struct{}
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
	var b [8]byte
	rand.Read(b[:])
	s := &AgentSandbox{runsc: runsc, id: "airlock-" + hex.EncodeToString(b[:]), done: make(chan struct{})}
	s.bundle = filepath.Join(StateDir, "bundles", s.id)
	s.runDir = filepath.Join(StateDir, "agents", s.id)
	for _, d := range []string{s.bundle, s.runDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	// The agent, the sandbox's uid 1000, creates its socket in runDir; on
	// the host that uid is 1000 too (gVisor's gofer does not remap), and
	// runDir sits in root's 0700 state directory, out of any host user's
	// reach.
	if err := os.Chown(s.runDir, sandboxUID, sandboxGID); err != nil {
		os.RemoveAll(s.bundle)
		os.RemoveAll(s.runDir)
		return nil, err
	}
	if s.lock, err = os.OpenFile(filepath.Join(s.bundle, "lock"), os.O_CREATE|os.O_RDWR, 0o600); err == nil {
		err = unix.Flock(int(s.lock.Fd()), unix.LOCK_EX)
	}
	if err != nil {
		s.remove()
		return nil, err
	}
	p.Env = append(p.Env, AgentSocketEnv+"="+agentRunDir+"/agent.sock")
	spec := &namespaces.Spec{Policy: p, Argv: []string{agentBin, namespaces.AgentArg}}
	err = writeBundle(s.bundle, s.id, spec,
		specs.Mount{Destination: agentBin, Type: "bind", Source: self, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: agentRunDir, Type: "bind", Source: s.runDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
	if err != nil {
		s.remove()
		return nil, err
	}
	create := runscFlags(runsc, s.id, []string{"--host-uds", "create"}, "create", "--bundle", s.bundle, s.id)
	// The sandbox keeps its stdio for its whole life: hand it a pipe of our
	// own (an *os.File, so that create's Wait does not wait for its end).
	logR, logW, err := os.Pipe()
	if err != nil {
		s.remove()
		return nil, err
	}
	go func() { io.Copy(log, logR); logR.Close() }()
	create.Stdout, create.Stderr = logW, logW
	create.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	err = create.Run()
	logW.Close()
	if err != nil {
		teardown(runsc, s.id)
		s.remove()
		return nil, fmt.Errorf("create gVisor sandbox: %w", err)
	}
	if out, err := runscCmd(runsc, s.id, "start", s.id).CombinedOutput(); err != nil {
		teardown(runsc, s.id)
		s.remove()
		return nil, fmt.Errorf("start gVisor sandbox: %v: %s", err, strings.TrimSpace(string(out)))
	}
	go func() {
		runscCmd(runsc, s.id, "wait", s.id).Run()
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
			return nil, fmt.Errorf("the sandbox ended: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Done is closed when the sandbox has ended.
func (s *AgentSandbox) Done() <-chan struct{} { return s.done }

// Kill ends the sandbox.
func (s *AgentSandbox) Kill() { runscCmd(s.runsc, s.id, "kill", "--all", s.id, "KILL").Run() }

// Wait waits for the sandbox to end and removes all of it.
func (s *AgentSandbox) Wait() error {
	<-s.done
	err := teardown(s.runsc, s.id)
	s.remove()
	return err
}

func (s *AgentSandbox) remove() {
	os.RemoveAll(s.runDir)
	os.RemoveAll(s.bundle)
	if s.lock != nil {
		s.lock.Close()
	}
}

// MemoryUsage is the sandbox's memory use, gVisor's own included.
func (s *AgentSandbox) MemoryUsage() int64 {
	v, err := readUint(filepath.Join("/sys/fs/cgroup/memory", s.id, "memory.usage_in_bytes"))
	if err != nil {
		return 0
	}
	return int64(v)
}
