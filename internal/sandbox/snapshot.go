package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Snapshots and forks, where the backend can (a backend.Snapshotter and
// Cloner: gVisor): a running sandbox is saved whole, memory, processes
// and files, into a directory while it runs on, and sandboxes cloned from
// there start as it was, each with an id, tokens and file systems of its
// own (gVisor's writable layers are its memory's, so part of the copy). A
// fork clones the copy at once and forgets it; a snapshot keeps it as a
// template (Template.Snapshot), whose home is the image store's
// (httpapi). A sandbox with a network is neither, yet: its copy would
// carry its addresses.

// MaxForks bounds one fork request's count.
const MaxForks = 64

// SnapshotOf is what a template of a snapshot needs of the sandbox it was
// taken of: its clones run under the same policy, the same mounts.
type SnapshotOf struct {
	Sandbox, Template string
	Backend           Backend
	Policy            policy.Policy
	Metadata          map[string]string
}

// Snapshot saves a copy of running sandbox id into dir, which must not
// exist; id runs on.
func (m *Manager) Snapshot(ctx context.Context, id, dir string) (SnapshotOf, error) {
	sb, err := m.Get(id)
	if err != nil {
		return SnapshotOf{}, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch _, cloner := sb.be.(backend.Cloner); {
	case sb.state.ended():
		return SnapshotOf{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	case sb.state.paused():
		return SnapshotOf{}, fmt.Errorf("%w: sandbox %s is paused: connect to it first, then snapshot or fork it", ErrConflict, id)
	case sb.net != nil:
		return SnapshotOf{}, fmt.Errorf("%w: sandbox %s has a network, and a sandbox with a network cannot be snapshotted or forked yet", ErrInvalid, id)
	case !cloner:
		return SnapshotOf{}, fmt.Errorf("%w: the %s backend cannot snapshot or fork a running sandbox (its memory): the gvisor backend can", ErrInvalid, sb.be.Name())
	}
	s, ok := sb.inst.(backend.Snapshotter)
	if !ok {
		return SnapshotOf{}, fmt.Errorf("%w: sandbox %s cannot be snapshotted", ErrInvalid, id)
	}
	if err := m.transition(sb, opSnapshot, Snapshotting); err != nil {
		return SnapshotOf{}, err
	}
	// However it ends, it runs on as it was.
	defer m.transition(sb, opSnapshot, Running)
	start := m.clock.Now()
	// Not cut short by a client that goes away: the agent must be told
	// to listen again, which Snapshot does however it ends.
	ctx = context.WithoutCancel(ctx)
	if err := m.quiesce(ctx, sb); err != nil {
		return SnapshotOf{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	if err := s.Snapshot(ctx, dir); err != nil {
		if errors.Is(err, backend.ErrUnsupported) {
			return SnapshotOf{}, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		return SnapshotOf{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	m.log.Info("sandbox snapshotted", "sandbox", id, "ms", m.since(start).Milliseconds())
	return SnapshotOf{Sandbox: id, Template: sb.TemplateID, Backend: sb.be, Policy: sb.pol, Metadata: maps.Clone(sb.Metadata)}, nil
}

// ForkResult is one fork's outcome: a sandbox, or why it did not start.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// Fork makes count copies of running sandbox id, each with ttl to live,
// from one snapshot of it; id runs on, its time to live untouched. The
// error is the snapshot's; each copy's is in its result.
func (m *Manager) Fork(ctx context.Context, id string, count int, ttl time.Duration) ([]ForkResult, error) {
	if count < 1 || count > MaxForks {
		return nil, fmt.Errorf("%w: count %d is out of range: a fork makes 1 to %d sandboxes", ErrInvalid, count, MaxForks)
	}
	if _, err := m.ttl(ttl); err != nil {
		return nil, err
	}
	tmp, err := m.scratchDir("forks")
	if err != nil {
		return nil, err
	}
	// Every clone has read what it needs once it answers: runsc restores
	// the memory before the agent runs again.
	defer os.RemoveAll(tmp)
	of, err := m.Snapshot(ctx, id, filepath.Join(tmp, "state"))
	if err != nil {
		return nil, err
	}
	tmpl := of.template(filepath.Join(tmp, "state"))
	sb, _ := m.Get(id) // for what the copies inherit; it may be gone by now
	req := CreateRequest{TemplateID: of.Template, TTL: ttl}
	if sb != nil {
		req.ClientID, req.AutoPause, req.AutoResume, req.Ingress = sb.ClientID, sb.autoPause, sb.AutoResume, sb.Ingress
	}
	out := make([]ForkResult, count)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			r := req
			r.Metadata = maps.Clone(of.Metadata)
			out[i].Sandbox, out[i].Err = m.create(ctx, r, &tmpl, nil, m.clock.Now())
		})
	}
	wg.Wait()
	return out, nil
}

// template is the template whose sandboxes are clones of the snapshot in
// dir.
func (of SnapshotOf) template(dir string) Template {
	return Template{Name: of.Template, Policy: of.Policy, Backend: of.Backend, Snapshot: dir}
}

// scratchDir makes a directory for a fork's snapshot (kind "forks") or
// a warm one ("warm"): in the state directory, where the next start
// removes what a crash left.
func (m *Manager) scratchDir(kind string) (string, error) {
	if m.cfg.StateDir == "" {
		return os.MkdirTemp("", "airlock-"+kind+"-")
	}
	dir := filepath.Join(m.cfg.StateDir, kind)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return os.MkdirTemp(dir, "")
}
