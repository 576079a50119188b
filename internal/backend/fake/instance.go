package fake

import (
	"context"
	"maps"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agent"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// box is what an agent is: the agent, in memory, and its directory. A
// checkpoint keeps it for the instance a restore makes.
type box struct {
	agent          *agent.Agent
	agentHandler   http.Handler
	dir, home, tmp string
	sock           string
	envMu          sync.Mutex
	env            map[string]string // what the daemon set up (setup)
}

// Instance is one agent of a Backend, served on its box's socket.
type Instance struct {
	*box
	b       *Backend
	policy  policy.Policy
	netns   *os.File
	stop    context.CancelFunc
	done    chan struct{}
	removed chan struct{} // closed when Wait returns
	once    sync.Once

	keep     bool               // it outlives its manager (live.go)
	quiesce  chan struct{}      // the agent was asked to let go of its socket
	relisten chan chan struct{} // and is told to listen again (serve.go)
	listenMu sync.Mutex         // one listenAgain at a time

	mu       sync.Mutex
	usage    backend.Usage
	paused   bool
	resumed  chan struct{} // closed at Resume
	killed   bool
	waited   bool
	saved    bool          // checkpointed: its box lives on
	asked    bool          // quiesce was asked since it last listened
	released chan struct{} // closed once it let go of its socket
}

// Policy is the policy the instance was started (restored, cloned) with.
func (i *Instance) Policy() policy.Policy { return i.policy }

// NetNS is the network namespace the instance was started with.
func (i *Instance) NetNS() *os.File { return i.netns }

// Home is the agent's home directory.
func (i *Instance) Home() string { return i.home }

// Env is the environment the daemon set up in the agent (what it posted
// to the agent's setup), which a restore keeps and a clone copies.
func (i *Instance) Env() map[string]string {
	i.envMu.Lock()
	defer i.envMu.Unlock()
	return maps.Clone(i.env)
}

// Dial connects to the agent. While the instance is paused it blocks until
// Resume, the end of the instance or of ctx: a frozen box answers nothing.
// Connections made before the pause keep working; the manager's gateway
// must not rely on them. While the agent has let go of its socket (a
// checkpoint's first step), Dial fails, as it does on a real backend.
func (i *Instance) Dial(ctx context.Context) (net.Conn, error) {
	for {
		i.mu.Lock()
		paused, resumed := i.paused, i.resumed
		i.mu.Unlock()
		if !paused {
			break
		}
		select {
		case <-resumed:
		case <-i.done:
			return nil, ErrEnded
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	select {
	case <-i.done:
		return nil, ErrEnded
	default:
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", i.sock)
}

// Done is closed once the agent has stopped serving.
func (i *Instance) Done() <-chan struct{} { return i.done }

// Kill stops the agent without waiting; a paused instance ends too.
func (i *Instance) Kill(context.Context) error {
	i.mu.Lock()
	i.killed = true
	i.mu.Unlock()
	i.stop()
	return nil
}

// Die ends the instance as an agent crash or the OOM killer would: by
// itself, with no Kill.
func (i *Instance) Die() {
	i.stop()
}

// Wait waits until the agent has stopped and removes its directory,
// unless a checkpoint keeps it.
func (i *Instance) Wait() error {
	<-i.done
	i.once.Do(func() {
		i.mu.Lock()
		saved := i.saved
		i.mu.Unlock()
		if !saved {
			// Its processes and kernels end with it, as a sandbox's do.
			i.agent.Close()
			os.RemoveAll(i.dir)
		}
		i.mu.Lock()
		i.waited = true
		i.mu.Unlock()
		close(i.removed)
	})
	return nil
}

// Removed is closed once Wait has returned: what a test waits on for a
// teardown that runs in the background.
func (i *Instance) Removed() <-chan struct{} { return i.removed }

// Usage reports the usage that SetUsage (or the backend's SetMemory) set,
// also after the instance has ended.
func (i *Instance) Usage(context.Context) (backend.Usage, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.usage, nil
}

// SetUsage sets what Usage reports.
func (i *Instance) SetUsage(u backend.Usage) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.usage = u
}

// Pause records the instance as paused, so that Dial blocks. Pausing an
// ended instance fails, as freezing a removed cgroup does.
func (i *Instance) Pause(context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	select {
	case <-i.done:
		return ErrEnded
	default:
	}
	if !i.paused {
		i.paused, i.resumed = true, make(chan struct{})
	}
	return nil
}

// Resume undoes Pause.
func (i *Instance) Resume(context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.paused {
		i.paused = false
		close(i.resumed)
	}
	return nil
}

// Paused reports whether the instance is paused.
func (i *Instance) Paused() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.paused
}

// Killed reports whether Kill was called.
func (i *Instance) Killed() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.killed
}

// Waited reports whether Wait has returned, its directory removed.
func (i *Instance) Waited() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.waited
}
