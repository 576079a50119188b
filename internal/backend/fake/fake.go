// Package fake is an isolation backend for tests only: it runs the real agent in-process, with no isolation and no root.
package fake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agent"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.Restorer     = (*Backend)(nil)
	_ backend.Cloner       = (*Backend)(nil)
	_ backend.Instance     = (*Instance)(nil)
	_ backend.Checkpointer = (*Instance)(nil)
	_ backend.Snapshotter  = (*Instance)(nil)
)

// ErrEnded is what an instance that has ended answers.
var ErrEnded = errors.New("fake instance has ended")

// Op names an operation of the backend or its instances whose failure a
// test can inject (SetError).
type Op string

const (
	OpStart      Op = "start"
	OpCheckpoint Op = "checkpoint"
	OpRestore    Op = "restore"
	OpSnapshot   Op = "snapshot"
	OpClone      Op = "clone"
	// OpFiles: the agent's stream of the sandbox's files stops short, as
	// when the agent cannot read them all.
	OpFiles Op = "files"
)

// Backend starts Instances: each one the real agent, serving on a unix
// socket in its own directory, as the test's own user, in the test's own
// process. Nothing is isolated: what the agent runs runs on the host, and
// outlives a Kill (there is no cgroup to kill it with).
//
// It keeps the whole contract of a backend that persists sandboxes
// (persist.go), so that the manager's pause to disk, restore, snapshots,
// forks and warm clones are tested without root: a checkpoint keeps the
// agent in memory and its directory, by a name the backend restores; a
// snapshot copies the files, which a clone starts a new agent over. Like
// a real runtime's, each fails unless the agent let go of its socket
// first.
type Backend struct {
	dir string
	log *slog.Logger

	mu          sync.Mutex
	starts      int
	clones      int
	boxes       int // directories made
	checkpoints int
	errs        map[Op]error
	startHook   func(context.Context) error
	memory      int64
	instances   []*Instance
	saved       map[string]*box      // checkpointed boxes, by name
	keepAlive   bool                 // live.go
	kept        map[string]*Instance // by handle, until adopted
}

// New returns a backend whose instances live under dir, which should be
// short (a unix socket's path has at most 107 bytes) and removed by the
// test, as t.TempDir's is. A nil log discards.
func New(dir string, log *slog.Logger) *Backend {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Backend{dir: dir, log: log, errs: map[Op]error{}, saved: map[string]*box{}}
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

// SetError makes every later op fail with err (nil: succeed).
func (b *Backend) SetError(op Op, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errs[op] = err
}

// SetStartError makes every later Start fail with err (nil: succeed).
func (b *Backend) SetStartError(err error) { b.SetError(OpStart, err) }

func (b *Backend) failure(op Op) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.errs[op]
}

// SetStartHook makes every later Start call hook first, and fail with
// what it returns: a test holds starts where it wants them (nil: none).
func (b *Backend) SetStartHook(hook func(ctx context.Context) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startHook = hook
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

// Clones counts the calls of Clone, failed ones included.
func (b *Backend) Clones() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clones
}

// Instances returns the instances started, restored or cloned so far,
// in order.
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
	hook := b.startHook
	b.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return nil, err
		}
	}
	if err := b.failure(OpStart); err != nil {
		return nil, err
	}
	bx, err := b.newBox()
	if err != nil {
		return nil, err
	}
	return b.serve(bx, p, netns)
}

// newBox makes a directory for a new agent, with its home and /tmp.
func (b *Backend) newBox() (*box, error) {
	b.mu.Lock()
	b.boxes++
	dir := filepath.Join(b.dir, strconv.Itoa(b.boxes))
	b.mu.Unlock()
	bx := &box{dir: dir, home: filepath.Join(dir, "home", "user"), tmp: filepath.Join(dir, "tmp"), sock: filepath.Join(dir, "a.sock"), env: map[string]string{}}
	for _, d := range []string{bx.home, bx.tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if len(bx.sock) > 107 {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("agent socket path of %d bytes: give the backend a shorter directory", len(bx.sock))
	}
	bx.agent = agent.New(b.log, bx.home)
	bx.agentHandler = bx.agent.Handler()
	return bx, nil
}
