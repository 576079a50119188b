package sandbox

import (
	"context"
	"fmt"
	"time"
)

// Pause stops every process of sandbox id. A paused sandbox keeps its
// memory and files (or, unless keepMemory, only its files:
// savedfiles.go) but uses no CPU, and its time to live is stopped: it
// lasts until resumed, killed, or the server's longest time to live has
// passed. Where its backend can, its memory goes to disk (savedisk.go).
func (m *Manager) Pause(ctx context.Context, id string, keepMemory bool) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	return m.pause(ctx, sb, keepMemory)
}

func (m *Manager) pause(ctx context.Context, sb *Sandbox, keepMemory bool) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.state.ended() {
		return fmt.Errorf("%w: %s", ErrNotFound, sb.ID)
	}
	if sb.state.paused() {
		return fmt.Errorf("%w: sandbox %s is already paused", ErrConflict, sb.ID)
	}
	if err := m.transition(sb, opPause, Pausing); err != nil {
		return err
	}
	to := Paused
	if !keepMemory {
		// Not cut short by a client that goes away: the box ends in it.
		if err := m.saveFiles(context.WithoutCancel(ctx), sb); err != nil {
			m.transition(sb, opPause, Running)
			return err
		}
		to = SavedFiles
	} else if m.canSave(sb) {
		// Not cut short by a client that goes away mid-checkpoint.
		if err := m.save(context.WithoutCancel(ctx), sb); err != nil {
			m.log.Warn("could not save the sandbox to disk: pausing it in memory", "sandbox", sb.ID, "err", err)
		} else {
			to = Saved
		}
	}
	if to == Paused {
		if err := sb.inst.Pause(ctx); err != nil {
			_ = sb.inst.Resume(context.WithoutCancel(ctx)) // never half paused
			m.transition(sb, opPause, Running)
			return fmt.Errorf("pause sandbox %s: %w", sb.ID, err)
		}
	}
	// Paused, it is removed when the server's longest time to live has
	// passed (without a bound, when killed).
	sb.timer.Stop()
	if max := m.cfg.MaxTTL; max > 0 {
		sb.endAt = m.clock.Now().Add(max)
		sb.timer.Reset(max)
	}
	m.transition(sb, opPause, to)
	if to.saved() {
		if err := m.writeRecord(sb); err != nil {
			m.log.Error("saved sandbox's record: it will not outlive this daemon", "sandbox", sb.ID, "err", err)
		}
	} else {
		m.keepLive(sb)
	}
	m.log.Info("sandbox paused", "sandbox", sb.ID, "to disk", to.saved())
	return nil
}

// Reboot resumes a paused sandbox from its files only, as E2B's connect
// with onResume 'reboot': what ran and what it held in memory are gone.
// A pause that kept the memory is undone first (briefly running it
// again), then redone keeping the files only, which the resume boots.
func (m *Manager) Reboot(ctx context.Context, id string, d time.Duration) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	// Refused before anything runs again: a sandbox that cannot keep
	// only its files stays paused.
	if err := m.filesPausable(sb.TemplateID); err != nil {
		return err
	}
	if err := filesPausableWith(sb.VolumeMounts); err != nil {
		return err
	}
	if err := m.Resume(ctx, id, d); err != nil {
		return err
	}
	if err := m.Pause(ctx, id, false); err != nil {
		return fmt.Errorf("reboot sandbox %s: %w", id, err)
	}
	return m.Resume(ctx, id, d)
}

// Resume restarts sandbox id if it is paused, with a time to live of d
// (0: the default). A running sandbox is left as it is.
func (m *Manager) Resume(ctx context.Context, id string, d time.Duration) error {
	return m.withTTL(id, d, func(sb *Sandbox, d time.Duration) error {
		from := sb.state
		if !from.paused() {
			return nil
		}
		if from.saved() {
			m.mu.Lock()
			full := m.cfg.MaxSandboxes > 0 && m.running()+m.starting >= m.cfg.MaxSandboxes
			m.mu.Unlock()
			if full {
				return fmt.Errorf("%w: the limit is %d", ErrTooMany, m.cfg.MaxSandboxes)
			}
			if err := m.hostRoom(); err != nil {
				return err
			}
		}
		if err := m.transition(sb, opResume, Resuming); err != nil {
			return err
		}
		// Not cut short by a client that goes away: a box thawed but
		// still marked paused would refuse its traffic.
		var err error
		if from.saved() {
			err = m.restore(context.WithoutCancel(ctx), sb, from)
		} else if err = sb.inst.Resume(context.WithoutCancel(ctx)); err != nil {
			err = fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		if err != nil {
			m.transition(sb, opResume, from)
			return err
		}
		m.transition(sb, opResume, Running)
		sb.endAt = m.clock.Now().Add(d)
		sb.timer.Reset(d)
		m.keepLive(sb)
		m.log.Info("sandbox resumed", "sandbox", id)
		return nil
	})
}
