package sandbox

import (
	"context"
	"slices"
	"time"
)

// Sample is one measurement of a sandbox, for getMetrics' history.
type Sample struct {
	At    time.Time
	Usage Usage
}

// historyLen bounds a sandbox's samples: an hour at the default interval.
const historyLen = 720

// DefaultMetricsInterval is how often sandboxes are measured for their
// history, as E2B's metrics come (every 5 s).
const DefaultMetricsInterval = 5 * time.Second

// History is s's samples taken in [start, end], oldest first.
func (s *Sandbox) History(start, end time.Time) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Sample
	for _, sm := range s.history {
		if !sm.At.Before(start) && !sm.At.After(end) {
			out = append(out, sm)
		}
	}
	return out
}

func (s *Sandbox) record(sm Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.history) == historyLen {
		s.history = slices.Delete(s.history, 0, 1)
	}
	s.history = append(s.history, sm)
}

// sample measures every running sandbox each interval, until the manager
// shuts down. A paused one keeps the samples it has: it uses nothing.
func (m *Manager) sample(interval time.Duration) {
	defer m.wg.Done()
	tick := m.clock.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C():
		}
		m.mu.Lock()
		all := make([]*Sandbox, 0, len(m.sandboxes))
		for _, sb := range m.sandboxes {
			all = append(all, sb)
		}
		m.mu.Unlock()
		for _, sb := range all {
			if sb.Paused() {
				continue
			}
			ctx, cancel := context.WithTimeout(m.ctx, interval)
			u, err := sb.usage(ctx, &sb.sampleMark)
			cancel()
			if err == nil {
				sb.record(Sample{At: m.clock.Now().UTC(), Usage: u})
			}
		}
	}
}
