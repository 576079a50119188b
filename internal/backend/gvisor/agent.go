package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandboxbin"
)

// agentRunDir is where a sandbox has its agent's directory (agentdir.go).
const agentRunDir = layout.CodeDir + "/run"

// agentSandbox is a long-lived gVisor sandbox running the agent.
type agentSandbox struct {
	be    *Backend
	runsc string
	log   *slog.Logger
	b     *bundle
	agent *agentDir
	run   *exec.Cmd
	// kept is runsc started through a keeper (adopt.go): then it, not
	// run's Process, is signalled and waited for.
	kept backend.KeptProcess
	// failure is what runsc said if it failed; read after done.
	failure *runscFailure
	done    chan struct{}
}

var (
	_ backend.Instance     = (*agentSandbox)(nil)
	_ backend.RootExporter = (*agentSandbox)(nil)
)

// Start starts a gVisor sandbox whose command is the airlock agent. It
// returns once runsc runs; Dial waits for the agent.
func (be *Backend) Start(ctx context.Context, p policy.Policy, netns *os.File) (backend.Instance, error) {
	s, err := be.prepare(ctx, p, netns)
	if err != nil {
		return nil, err
	}
	if err := s.start("run"); err != nil {
		s.b.remove("")
		return nil, err
	}
	return s, nil
}

// prepare makes the bundle of a new agent sandbox under p: what a run
// starts, or a clone (checkpoint.go) restores a copy into.
func (be *Backend) prepare(ctx context.Context, p policy.Policy, netns *os.File) (*agentSandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := backend.CheckNetNS(&p, netns); err != nil {
		return nil, err
	}
	// The agent's reserve of tasks, above the user's pids limit.
	p.Pids += agentproto.AgentTasks
	// The agent is the sandbox binary, which runsc binds in by its path.
	bin, err := sandboxbin.Install(be.stateDir)
	if err != nil {
		return nil, err
	}
	self := bin.Path
	b, err := be.newBundle(&p)
	if err != nil {
		return nil, err
	}
	b.netns = netns
	s, err := be.newAgentSandbox(b, p.Root)
	if err != nil {
		b.remove("")
		return nil, err
	}
	p.Env = append(p.Env, agentproto.SocketEnv+"="+agentRunDir+"/"+agentSocket)
	spec := &backend.Spec{Policy: p, Argv: []string{layout.AgentPath, agentproto.AgentArg}, NetNS: netns}
	mounts := []specs.Mount{
		{Destination: layout.AgentPath, Type: "bind", Source: self, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		{Destination: agentRunDir, Type: "bind", Source: s.agent.path, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
	}
	if p.Root { // a root, so sudo (agent/sudo.go)
		mounts = append(mounts, specs.Mount{Destination: layout.SudoPath, Type: "bind", Source: self, Options: []string{"bind", "ro", "nosuid", "nodev"}})
	}
	if err := be.writeBundle(b, spec, mounts...); err != nil {
		b.remove("")
		return nil, err
	}
	return s, nil
}

// newAgentSandbox is the sandbox of bundle b, with its agent's directory,
// whose owner is the agent's uid: the sandbox's root where it has one
// (then code as user cannot put a socket of its own in the agent's place),
// else user. The directory sits in root's 0700 state directory, out of
// any host user's reach.
func (be *Backend) newAgentSandbox(b *bundle, root bool) (*agentSandbox, error) {
	uid := layout.UID
	if root {
		uid = 0
	}
	d, err := makeAgentDir(b.agentDir(), uid, b.cg.Holds)
	if err != nil {
		return nil, err
	}
	b.agent = d
	return &agentSandbox{be: be, runsc: be.runsc, log: be.log, b: b, agent: d, failure: &runscFailure{}, done: make(chan struct{})}, nil
}

// start runs the sandbox with runsc's command (run, or restore with its
// flags), attached: runsc is the sandbox's parent for its whole life, and
// killing runsc kills the sandbox.
func (s *agentSandbox) start(command string, flags ...string) error {
	b := s.b
	args := append(append([]string{command}, flags...), "--bundle", b.dir, b.id)
	s.run = b.runsc(s.runsc, append([]string{"--host-uds", "create", "--log-fd", "3"}, b.runFlags()...), args...)
	errW, err := s.failure.pipe()
	if err != nil {
		return err
	}
	s.run.ExtraFiles = []*os.File{errW}
	// The sandbox keeps its stdio for its whole life: hand it a pipe of our
	// own, an *os.File, so that nothing waits for it to close.
	logR, logW, err := os.Pipe()
	if err != nil {
		errW.Close()
		return err
	}
	log := backend.LineLog(s.log)
	go func() { io.Copy(log, logR); logR.Close() }()
	s.run.Stdout, s.run.Stderr = logW, logW
	s.run.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if s.be.keepAlive {
		s.kept, err = s.be.keeper.StartKept(s.run)
		if err == nil {
			// The keeper holds the log's read end too: runsc's sandbox
			// writes the agent's log, which must not fail while no
			// daemon reads it.
			if err = s.keep(logR); err != nil {
				s.kept.Signal(syscall.SIGKILL)
				s.kept.Wait()
				s.kept = nil
				b.teardown(s.runsc) // what runsc made of it
			}
		}
	} else {
		err = s.run.Start()
	}
	logW.Close()
	errW.Close()
	if err != nil {
		return fmt.Errorf("start runsc: %w", err)
	}
	go func() {
		if s.kept != nil {
			s.kept.Wait()
		} else {
			backend.AwaitExit(s.run.Process)
			s.run.Wait()
		}
		close(s.done)
	}()
	return nil
}

// Dial connects to the agent, waiting for it to listen (it starts after
// the sandbox does). It never follows what is in the socket's place
// (agentdir.go): anything but the agent's socket there is an error once
// it has stayed there for notAgentGrace.
func (s *agentSandbox) Dial(ctx context.Context) (net.Conn, error) {
	var wrongSince time.Time
	for {
		c, err := s.agent.dial(ctx)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, errNotAgentSocket) {
			if wrongSince.IsZero() {
				wrongSince = time.Now()
			} else if time.Since(wrongSince) > notAgentGrace {
				return nil, err
			}
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

// notAgentGrace is how long the socket's place may hold something else
// before Dial gives up. The agent's own socket is, for a moment, not
// yet its: gVisor's gofer binds it as itself (root) and only then hands
// it to the agent's uid (runsc/fsgofer's BindAt), and a loaded host can
// stretch that moment past a dial (a create failed so in the escape
// catalogue). Nothing is connected to meanwhile: only the wait is longer.
const notAgentGrace = 2 * time.Second

// Done is closed when the sandbox has ended.
func (s *agentSandbox) Done() <-chan struct{} { return s.done }

// Kill ends the sandbox: runsc is its parent, and an attached sandbox dies
// with it (Pdeathsig); Wait then kills whatever is left in its cgroup. A
// paused sandbox is thawed, or the signal would wait for it.
func (s *agentSandbox) Kill(ctx context.Context) error {
	var err error
	if s.kept != nil {
		err = s.kept.Signal(syscall.SIGKILL)
	} else {
		err = s.run.Process.Kill()
	}
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	// A host without a freezer has nothing to thaw.
	if ferr := s.b.cg.Freeze(ctx, false); err == nil && !errors.Is(ferr, cgroups.ErrNotPausable) {
		err = ferr
	}
	select {
	case <-s.done:
		return nil // it had ended already: nothing to kill
	default:
		return err
	}
}

// Pause stops the whole sandbox, gVisor's kernel included, where it is
// (its cgroup's freezer), until Resume.
func (s *agentSandbox) Pause(ctx context.Context) error { return s.b.cg.Freeze(ctx, true) }

// Resume restarts a paused sandbox.
func (s *agentSandbox) Resume(ctx context.Context) error { return s.b.cg.Freeze(ctx, false) }

// Wait waits for the sandbox to end and removes all of it; a restore
// that never came up leaves its saved sandbox, for another try.
func (s *agentSandbox) Wait() error {
	<-s.done
	if s.isSaved() {
		return s.b.release(s.runsc)
	}
	return s.b.remove(s.runsc)
}

// Usage is what the sandbox's cgroup has counted, gVisor's own included.
func (s *agentSandbox) Usage(context.Context) (backend.Usage, error) {
	st, err := s.b.cg.Stats()
	if err != nil {
		return backend.Usage{}, fmt.Errorf("sandbox %s: %w", s.b.id, err)
	}
	return backend.Usage{Memory: st.Memory, Cache: st.Cache, CPU: st.CPU, MaxMemory: st.MaxMemory, OOMKills: st.OOMKills}, nil
}
