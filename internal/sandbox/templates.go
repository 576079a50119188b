package sandbox

import (
	"fmt"
	"slices"
	"time"
)

// What the API lists of templates (E2B's template list): which there
// are, what their sandboxes get, and how much they are used.

// use is how often a template's sandboxes were created, and when last.
type use struct {
	count int64
	last  time.Time
}

// Configured returns the configured templates (base,
// code-interpreter-v1…), in the configuration's order.
func (m *Manager) Configured() []Template { return slices.Clone(m.cfg.Templates) }

// Lookup returns the template a create of name would start from: a
// configured one, or the Source's.
func (m *Manager) Lookup(name string) (Template, error) {
	for _, t := range m.cfg.Templates {
		if t.Name == name {
			return t, nil
		}
	}
	if m.cfg.Source == nil {
		return Template{}, fmt.Errorf("%w %q", ErrUnknownTemplate, name)
	}
	return m.cfg.Source.Template(name)
}

// Use reports how many sandboxes of the template called name were
// created since the manager started, and when the last one was (zero:
// none).
func (m *Manager) Use(name string) (count int64, last time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.uses[name]
	return u.count, u.last
}

// Started is when the manager started: when it made its configured
// templates.
func (m *Manager) Started() time.Time { return m.started }

// used counts a sandbox created of the template called name.
func (m *Manager) used(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.uses[name] = use{m.uses[name].count + 1, m.clock.Now().UTC()}
}
