package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
)

// A pause saves the sandbox to disk where its backend can (a
// backend.Checkpointer: gVisor): its memory, processes and files go into
// the backend's state, the box ends and its memory is freed, its network
// is removed (its policy is kept), and a record of what the API knows of
// it (ids, tokens, metadata, policy, time to live) goes to
// <StateDir>/saved/<id>.json. It then counts against no limit, survives a
// restart of the daemon (and of the host), and connect restores it, in a
// network made anew under its policy: new addresses, its open connections
// ended, as E2B's resume ends them. Elsewhere a pause freezes the box in
// memory, as before.

// canSave reports whether a pause of sb saves it to disk.
func (m *Manager) canSave(sb *Sandbox) bool {
	_, c := bare(sb.inst).(backend.Checkpointer)
	_, r := sb.be.(backend.Restorer)
	return c && r && !m.cfg.PauseInMemory
}

// save saves sb to disk; sb.mu is held. On error sb runs on.
func (m *Manager) save(ctx context.Context, sb *Sandbox) error {
	start := m.clock.Now()
	if err := m.quiesce(ctx, sb); err != nil {
		return err
	}
	inst := sb.inst
	name, err := bare(inst).(backend.Checkpointer).Checkpoint(ctx)
	if err != nil {
		return err
	}
	// Its box has ended; the watcher (waiting for sb.mu) sees it is no
	// longer sb's. Its network goes: nothing runs in it.
	sb.inst, sb.savedName = nil, name
	if n, ok := inst.(netInstance); ok {
		sb.setNetwork(nil, n.net.Policy())
		if err := n.net.Close(); err != nil {
			m.log.Error("sandbox saved: remove its network", "sandbox", sb.ID, "err", err)
		}
	}
	m.log.Info("sandbox saved to disk", "sandbox", sb.ID, "ms", m.since(start).Milliseconds())
	return nil
}

// quiesce has sb's agent let go of the host's socket, which checkpoints
// cannot keep: every connection to it ends here, as on E2B's pause. The
// backend's Checkpoint or Snapshot tells it to listen again. sb.mu is
// held.
func (m *Manager) quiesce(ctx context.Context, sb *Sandbox) error {
	// Not sb.transport: it dials through sb.instance(), which waits for
	// sb.mu, held here.
	if err := postAgent(ctx, sb.inst, (*agentproto.Client).Checkpoint, 10*time.Second); err != nil {
		return err
	}
	sb.transport.CloseIdleConnections()
	sb.ports.CloseIdleConnections()
	return nil
}

// restore brings sb back from disk, where it was saved as from (Saved or
// SavedFiles); sb.mu is held.
func (m *Manager) restore(ctx context.Context, sb *Sandbox, from State) error {
	start := m.clock.Now()
	if from == SavedFiles {
		inst, att, err := m.restoreFiles(ctx, sb)
		if errors.As(err, new(networkError)) {
			return fmt.Errorf("restore sandbox %s: %w", sb.ID, err)
		} else if err != nil {
			return &UnrestorableError{ID: sb.ID, Err: err}
		}
		os.Remove(m.filesPath(sb.ID))
		return m.restored(sb, inst, att, start)
	}
	// Its volumes where they are now, by name.
	pol, err := m.repointVolumes(sb.pol, sb.VolumeMounts, "sandbox "+sb.ID)
	if err != nil {
		return &UnrestorableError{ID: sb.ID, Err: err}
	}
	inst, att, err := m.inNetwork(ctx, sb.ID, pol, func(netns *os.File) (Instance, error) {
		return sb.be.(backend.Restorer).Restore(ctx, sb.savedName, pol, netns)
	})
	if errors.As(err, new(networkError)) {
		// Its saved state is whole: another try may find a network.
		return fmt.Errorf("restore sandbox %s: %w", sb.ID, err)
	} else if err != nil {
		return &UnrestorableError{ID: sb.ID, Err: err}
	}
	if err := warm(ctx, inst); err != nil {
		// Its saved state stays, for another try.
		inst.Kill(context.Background())
		inst.Wait()
		return &UnrestorableError{ID: sb.ID, Err: fmt.Errorf("its agent: %w", err)}
	}
	// Taken: what it was restored from goes.
	if c, ok := bare(inst).(backend.Committer); ok {
		c.Commit()
	}
	sb.pol.Mounts = pol.Mounts
	return m.restored(sb, inst, att, start)
}

// restored makes inst, restored since start, sb's box, and att (nil:
// none) its network; sb.mu is held.
func (m *Manager) restored(sb *Sandbox, inst Instance, att NetAttachment, start time.Time) error {
	sb.inst, sb.savedName = inst, ""
	if att != nil {
		sb.setNetwork(att, att.Policy())
	}
	m.watch(sb, inst)
	m.removeRecord(sb.ID)
	m.log.Info("sandbox restored from disk", "sandbox", sb.ID, "ms", m.since(start).Milliseconds())
	return nil
}

// forget removes what is saved of sb, saved as from (Saved or
// SavedFiles); sb.mu is held.
func (m *Manager) forget(sb *Sandbox, from State) {
	if from == SavedFiles {
		os.Remove(m.filesPath(sb.ID))
	} else if err := sb.be.(backend.Restorer).Forget(sb.savedName); err != nil {
		m.log.Error("forget saved sandbox", "sandbox", sb.ID, "err", err)
	}
	sb.savedName = ""
	m.removeRecord(sb.ID)
}
