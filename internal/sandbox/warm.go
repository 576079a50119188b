package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Warm snapshots. A template whose sandboxes are slow to become ready (a
// start command and its ready check; the code interpreter's kernel, which
// imports pandas and matplotlib) asks for one (Template.WarmSnapshot).
// Once per version of it, the manager starts a sandbox, readies it, lets
// its agent settle, saves it whole (backend.Snapshotter) and kills it;
// then its pool's refills and its cold creates are clones of that save
// (backend.Cloner), which start where the first one was ready instead of
// running its start again. Where the backend cannot clone (namespaces),
// before the save is made, or if it fails, sandboxes start as before.
//
// A clone is a copy of memory. Its agent reseeds the kernels' random
// generators (agent/clone.go); a start command's own processes are
// copies, as on E2B, whose templates are memory snapshots taken after
// their start command.

// warmSnap is the save of one version of a template's ready sandbox.
type warmSnap struct {
	version string
	be      Backend
	done    chan struct{} // closed once dir or err is set
	dir     string
	err     error
	// broken: a clone of it failed; the version's sandboxes start afresh.
	broken atomic.Bool

	// use is held shared by clones reading dir, and exclusively by its
	// removal.
	use     sync.RWMutex
	removed bool
}

// made reports whether w is there to clone, without waiting.
func (w *warmSnap) made() bool {
	if w == nil {
		return false
	}
	select {
	case <-w.done:
		return w.err == nil && !w.broken.Load()
	default:
		return false
	}
}

// warmSnapshot returns t's warm snapshot; if its version has none yet,
// nil, or if start, one begun in the background. Its pool starts it: a
// template with no pool runs no sandbox that no one asked for. Nil too
// if t wants none or its backend cannot clone.
func (m *Manager) warmSnapshot(t *Template, start bool) *warmSnap {
	be := m.backendOf(t)
	if _, ok := be.(backend.Cloner); !ok || !t.WarmSnapshot || t.Snapshot != "" {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	w := m.warm[t.Name]
	if w != nil && w.version == t.Version {
		return w
	}
	if !start {
		return nil
	}
	if w != nil {
		m.removing.Add(1)
		go func() { defer m.removing.Done(); w.remove() }()
	}
	w = &warmSnap{version: t.Version, be: be, done: make(chan struct{})}
	m.warm[t.Name] = w
	m.wg.Add(1)
	go m.makeWarm(*t, w)
	return w
}

// makeWarm makes w, a warm snapshot of t.
func (m *Manager) makeWarm(t Template, w *warmSnap) {
	defer m.wg.Done()
	defer close(w.done)
	start := m.clock.Now()
	w.dir, w.err = m.saveReady(m.ctx, &t, w.be)
	if w.err != nil {
		m.log.Warn("warm snapshot not made: sandboxes start afresh", "template", t.Name, "err", w.err)
		return
	}
	m.metrics.warmMade.Add(1)
	m.log.Info("warm snapshot made", "template", t.Name, "ms", m.since(start).Milliseconds())
}

// saveReady starts a sandbox of t, readies it, and saves it into a new
// directory, whose path it returns.
func (m *Manager) saveReady(ctx context.Context, t *Template, be Backend) (string, error) {
	inst, err := startBox(ctx, be, t, t.Policy, nil)
	if err != nil {
		return "", err
	}
	defer m.discard(inst)
	s, ok := inst.(backend.Snapshotter)
	if !ok {
		return "", fmt.Errorf("the %s backend cannot save its sandboxes", be.Name())
	}
	if err := prepare(ctx, t, inst); err != nil {
		return "", err
	}
	// The kernel that the agent prestarts, importing modules, is what a
	// clone should not start again: wait for it. Then the agent lets go of
	// the host's socket, which a save cannot keep.
	if err := postAgent(ctx, inst, (*agentproto.Client).Settle, time.Minute); err != nil {
		return "", fmt.Errorf("settle: %w", err)
	}
	if err := postAgent(ctx, inst, (*agentproto.Client).Checkpoint, 10*time.Second); err != nil {
		return "", fmt.Errorf("quiesce: %w", err)
	}
	tmp, err := m.scratchDir("warm")
	if err != nil {
		return "", err
	}
	dir := filepath.Join(tmp, "state")
	if err := s.Snapshot(ctx, dir); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	return dir, nil
}

// cloneWarm starts a clone of w for sandbox id under pol (its template's
// policy, in a network of its own if pol has one) and readies it; nil if
// w is not made yet or the clone failed, which it logs: the caller
// starts a sandbox afresh.
func (m *Manager) cloneWarm(ctx context.Context, w *warmSnap, id string, pol policy.Policy) (Instance, NetAttachment) {
	if !w.made() {
		return nil, nil
	}
	w.use.RLock()
	defer w.use.RUnlock()
	if w.removed {
		return nil, nil
	}
	inst, att, err := m.inNetwork(ctx, id, pol, func(netns *os.File) (Instance, error) {
		return w.be.(backend.Cloner).Clone(ctx, w.dir, pol, netns)
	})
	if err == nil {
		// Its agent answers, and its kernels' random numbers are its own.
		if err = warm(ctx, inst); err == nil {
			err = postAgent(ctx, inst, (*agentproto.Client).Reseed, 30*time.Second)
		}
		if err != nil {
			m.discard(inst)
		}
	}
	if err != nil {
		// A network that could not be made says nothing of the snapshot:
		// the caller's own start meets the same and reports it.
		if ctx.Err() == nil && !errors.As(err, new(networkError)) && !w.broken.Swap(true) {
			m.log.Warn("warm snapshot: a clone failed; its template's sandboxes start afresh", "err", err)
		}
		return nil, nil
	}
	m.metrics.clones.Add(1)
	return inst, att
}

// remove deletes w's save once no clone reads it.
func (w *warmSnap) remove() {
	<-w.done
	w.use.Lock()
	defer w.use.Unlock()
	w.removed = true
	if w.dir != "" {
		os.RemoveAll(filepath.Dir(w.dir))
	}
}

// removeWarm deletes every warm snapshot (at Shutdown).
func (m *Manager) removeWarm() {
	m.mu.Lock()
	all := m.warm
	m.warm = map[string]*warmSnap{}
	m.mu.Unlock()
	for _, w := range all {
		w.remove()
	}
}

// postAgent makes call, a private endpoint's method of agentproto.Client,
// to inst's agent.
func postAgent(ctx context.Context, inst Instance, call func(*agentproto.Client, context.Context) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr := agentTransport(the(inst))
	defer tr.CloseIdleConnections()
	return call(&agentproto.Client{Transport: tr}, ctx)
}
