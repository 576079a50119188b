package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

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
// (httpapi). A copy of a sandbox with a network gets a network made for
// it (inNetwork): its own addresses, the rules the fork's original had or
// its create asks for.

// SnapshotOf is what a template of a snapshot needs of the sandbox it was
// taken of: its clones run under the same policy, the same mounts.
type SnapshotOf struct {
	Sandbox, Template string
	Backend           Backend
	// Policy is its clones' template's: without a network, which each
	// create asks for itself. Network is the one the sandbox had, which
	// its fork's copies get.
	Policy   policy.Policy
	Network  policy.Network
	Metadata map[string]string
	// VolumeMounts are the volumes it mounted, which its clones mount.
	VolumeMounts []VolumeMount
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
	case !cloner:
		return SnapshotOf{}, fmt.Errorf("%w: the %s backend cannot snapshot or fork a running sandbox (its memory): the gvisor backend can", ErrInvalid, sb.be.Name())
	}
	s, ok := bare(sb.inst).(backend.Snapshotter)
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
	pol := sb.pol
	pol.Network = policy.Network{}
	network, _ := sb.Network()
	return SnapshotOf{Sandbox: id, Template: sb.TemplateID, Backend: sb.be, Policy: pol, Network: network, Metadata: maps.Clone(sb.Metadata),
		VolumeMounts: slices.Clone(sb.VolumeMounts)}, nil
}
