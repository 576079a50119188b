// Package fake is an isolation backend for tests only: it runs the real agent in-process, with no isolation and no root.
package fake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

var (
	_ backend.Backend  = (*Backend)(nil)
	_ backend.Instance = (*Instance)(nil)
)

// ErrEnded is what an instance that has ended answers.
var ErrEnded = errors.New("fake instance has ended")

// Backend starts Instances: each one an agent serving on a unix socket in
// its own directory, as the test's own user, in the test's own process.
// Nothing is isolated: what the agent runs runs on the host, and outlives
// a Kill (there is no cgroup to kill it with).
type Backend struct {
	dir string
	log *slog.Logger

	mu         sync.Mutex
	starts     int
	startErr   error
	startDelay time.Duration
	memory     int64
	instances  []*Instance
}

// New returns a backend whose instances live under dir, which should be
// short (a unix socket's path has at most 107 bytes) and removed by the
// test, as t.TempDir's is. A nil log discards.
func New(dir string, log *slog.Logger) *Backend {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Backend{dir: dir, log: log}
}

// Name is "fake".
func (b *Backend) Name() string { return "fake" }

// Check checks only what every backend requires of a spec.
func (b *Backend) Check(spec *backend.Spec) error { return backend.CheckSpec(spec) }

// Run is not supported: a one-shot run is all isolation, and this backend
// has none to offer.
func (b *Backend) Run(context.Context, *backend.Spec) (*backend.Result, error) {
	return nil, errors.New("the fake backend does not run one-shot commands")
}

// Cleanup has nothing to do: instances live in the test's directory.
func (b *Backend) Cleanup(context.Context) error { return nil }

// SetStartError makes every later Start fail with err (nil: succeed).
func (b *Backend) SetStartError(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startErr = err
}

// SetStartDelay makes every later Start take d first, or until its
// context ends.
func (b *Backend) SetStartDelay(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startDelay = d
}

// SetMemory sets the memory that later instances report using.
func (b *Backend) SetMemory(bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.memory = bytes
}

// Starts counts the calls of Start, failed ones included.
func (b *Backend) Starts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.starts
}

// Instances returns the instances started so far, in order.
func (b *Backend) Instances() []*Instance {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*Instance(nil), b.instances...)
}

// Live counts the instances that have not ended.
func (b *Backend) Live() int {
	n := 0
	for _, i := range b.Instances() {
		select {
		case <-i.done:
		default:
			n++
		}
	}
	return n
}

// Start starts an agent in a new directory. Its life is not bound to ctx,
// which only bounds the start, as a real backend's. A network namespace
// is only remembered (NetNS): the fake agent runs in the test's own.
func (b *Backend) Start(ctx context.Context, p policy.Policy, netns *os.File) (backend.Instance, error) {
	b.mu.Lock()
	b.starts++
	n, err, delay, memory := b.starts, b.startErr, b.startDelay, b.memory
	b.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.dir, strconv.Itoa(n))
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("agent socket (%d bytes of path): %w", len(sock), err)
	}
	serve, stop := context.WithCancel(context.Background())
	i := &Instance{
		policy: p, netns: netns, dir: dir, home: home, sock: sock, stop: stop,
		done:  make(chan struct{}),
		usage: backend.Usage{Memory: memory},
	}
	go func() {
		defer close(i.done)
		if err := agent.New(b.log, home).Serve(serve, ln); err != nil {
			b.log.Warn("fake agent", "err", err)
		}
	}()
	b.mu.Lock()
	b.instances = append(b.instances, i)
	b.mu.Unlock()
	return i, nil
}

// Instance is one agent of a Backend.
type Instance struct {
	policy          policy.Policy
	netns           *os.File
	dir, home, sock string
	stop            context.CancelFunc
	done            chan struct{}
	removed         sync.Once

	mu      sync.Mutex
	usage   backend.Usage
	paused  bool
	resumed chan struct{} // closed at Resume
	killed  bool
	waited  bool
}

// Policy is the policy the instance was started with.
func (i *Instance) Policy() policy.Policy { return i.policy }

// NetNS is the network namespace the instance was started with.
func (i *Instance) NetNS() *os.File { return i.netns }

// Home is the agent's home directory.
func (i *Instance) Home() string { return i.home }

// Dial connects to the agent. While the instance is paused it blocks until
// Resume, the end of the instance or of ctx: a frozen box answers nothing.
// Connections made before the pause keep working; the manager's gateway
// must not rely on them.
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

// Wait waits until the agent has stopped and removes its directory.
func (i *Instance) Wait() error {
	<-i.done
	i.removed.Do(func() { os.RemoveAll(i.dir) })
	i.mu.Lock()
	i.waited = true
	i.mu.Unlock()
	return nil
}

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
