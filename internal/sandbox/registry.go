package sandbox

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandboxid"
)

// running is how many registered sandboxes run (or are paused in
// memory); m.mu is held.
func (m *Manager) running() int { return len(m.sandboxes) - int(m.saved.Load()) }

// register makes sb, set up, a sandbox that clients find, running with
// ttl to live. It stops counting as starting (reserve) in the same
// critical section.
func (m *Manager) register(sb *Sandbox, ttl time.Duration) error {
	// Locked until its time to live is set: a client may find it in a
	// list the moment it is registered, and pause it or set its timeout.
	sb.mu.Lock()
	defer sb.mu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrShuttingDown
	}
	if err := m.transition(sb, opCreate, Running); err != nil {
		m.mu.Unlock()
		return err
	}
	m.sandboxes[sb.ID] = sb
	m.starting--
	m.mu.Unlock()
	sb.endAt = m.clock.Now().Add(ttl)
	sb.timer = m.clock.AfterFunc(ttl, func() { m.expire(sb) })
	m.keepLive(sb)
	return nil
}

// Get returns the sandbox with id.
func (m *Manager) Get(id string) (*Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok || sb.private {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return sb, nil
}

// All returns every sandbox, in no order: what a caller that looks at
// each one needs, without List's sorting under the manager's lock.
func (m *Manager) All() []*Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Sandbox, 0, len(m.sandboxes))
	for _, sb := range m.sandboxes {
		if !sb.private {
			out = append(out, sb)
		}
	}
	return out
}

// List returns the sandboxes whose metadata contains every pair of
// filter, oldest first.
func (m *Manager) List(filter map[string]string) []*Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Sandbox
	for _, sb := range m.sandboxes {
		match := !sb.private
		for k, v := range filter {
			if sb.Metadata[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(a, b *Sandbox) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// End ends sb now: how the creator of a private sandbox ends it.
func (m *Manager) End(sb *Sandbox) { m.remove(sb, "killed") }

// Kill ends the sandbox with id now.
func (m *Manager) Kill(id string) error {
	sb, err := m.Get(id)
	if err != nil {
		return err
	}
	m.remove(sb, "killed")
	return nil
}

// remove unregisters sb and destroys it; the first caller wins.
func (m *Manager) remove(sb *Sandbox, why string) {
	m.mu.Lock()
	if m.sandboxes[sb.ID] != sb {
		m.mu.Unlock()
		return
	}
	delete(m.sandboxes, sb.ID)
	m.dropLive(sb.ID)
	// Shutdown waits for this teardown, too: one that began just before
	// it must not be cut short by the process exiting.
	m.removing.Add(1)
	defer m.removing.Done()
	m.mu.Unlock()
	// Killed under the sandbox's lock, which a pause takes too: no pause
	// can come after the kill and freeze what is dying.
	sb.mu.Lock()
	if sb.timer != nil {
		sb.timer.Stop()
	}
	from := sb.state
	if err := m.transition(sb, opKill, Killing); err != nil {
		m.log.Error("kill sandbox", "sandbox", sb.ID, "err", err)
	}
	inst := sb.inst
	if inst == nil {
		m.forget(sb, from)
	} else if err := inst.Kill(context.Background()); err != nil {
		m.log.Error("kill sandbox", "sandbox", sb.ID, "err", err)
	}
	sb.mu.Unlock()
	if inst != nil {
		if err := inst.Wait(); err != nil {
			m.log.Error("sandbox teardown", "sandbox", sb.ID, "err", err)
		}
	}
	// Counted before it is seen gone: whoever waits for its end finds
	// it in the metrics.
	m.metrics.ended.Add(1)
	sb.mu.Lock()
	m.transition(sb, opKill, Gone)
	sb.mu.Unlock()
	close(sb.ended)
	if sb.refill != nil {
		sb.refill.kick()
	}
	sb.transport.CloseIdleConnections()
	sb.ports.CloseIdleConnections()
	m.log.Info("sandbox "+why, "sandbox", sb.ID)
}

// Counts reports running (claimed) and pooled sandboxes per template.
func (m *Manager) Counts() (running map[string]int, pooled map[string]int) {
	running, pooled = map[string]int{}, map[string]int{}
	m.mu.Lock()
	for _, sb := range m.sandboxes {
		running[sb.TemplateID]++
	}
	pools := maps.Clone(m.pools)
	m.mu.Unlock()
	for name, p := range pools {
		p.mu.Lock()
		pooled[name] = len(p.ready[plainKind]) + len(p.ready[netKind])
		p.mu.Unlock()
	}
	return running, pooled
}

// newSandboxID is a new id, beginning with prefix (sandboxid.New).
func newSandboxID(prefix string) string { return sandboxid.New(prefix) }
