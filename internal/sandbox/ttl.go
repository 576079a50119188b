package sandbox

import (
	"errors"
	"fmt"
	"time"
)

// A sandbox's time to live is a timer on the manager's clock (clock.go),
// set when it is registered, reset by SetTTL and a resume, and stretched
// to the server's longest while it is paused; when it fires, expire
// kills the sandbox or pauses it.

// ttl is the time to live d asks for (0: the default), within the
// server's bounds.
func (m *Manager) ttl(d time.Duration) (time.Duration, error) {
	if d == 0 {
		d = m.cfg.DefaultTTL
	}
	if d < 0 {
		return 0, fmt.Errorf("%w: timeout must not be negative", ErrInvalid)
	}
	if m.cfg.MaxTTL > 0 && d > m.cfg.MaxTTL {
		return 0, fmt.Errorf("%w: timeout %s is above this server's maximum of %s", ErrInvalid, d, m.cfg.MaxTTL)
	}
	return d, nil
}

// SetTTL makes the sandbox end d from now.
func (m *Manager) SetTTL(id string, d time.Duration) error {
	return m.withTTL(id, d, func(sb *Sandbox, d time.Duration) error {
		if sb.state.paused() {
			return fmt.Errorf("%w: sandbox %s is paused: connect to resume it", ErrConflict, id)
		}
		sb.endAt = m.clock.Now().Add(d)
		sb.timer.Reset(d)
		m.keepLive(sb)
		sb.Log("info", "sandbox", "timeout set", "endAt", sb.endAt.UTC().Format(time.RFC3339))
		return nil
	})
}

// withTTL calls f with sandbox id, locked and not being killed, and d
// checked against the server's bounds (0: the default).
func (m *Manager) withTTL(id string, d time.Duration, f func(*Sandbox, time.Duration) error) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	if d, err = m.ttl(d); err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.state.ended() {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return f(sb, d)
}

// expire ends sb's time to live: it is killed, or paused if it asked to
// be (and killed if it cannot be). A paused one is killed.
func (m *Manager) expire(sb *Sandbox) {
	sb.mu.Lock()
	auto := sb.autoPause && !sb.state.paused()
	// A timer that fired just before a pause, a resume or a new time to
	// live is stale.
	stale := m.clock.Now().Before(sb.endAt)
	sb.mu.Unlock()
	if stale {
		return
	}
	if auto {
		if err := m.pause(m.ctx, sb, !sb.autoPauseFiles); err == nil || errors.Is(err, ErrConflict) {
			return
		}
	}
	m.remove(sb, "expired")
}
