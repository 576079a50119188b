package sandbox

import (
	"errors"
	"testing"
)

// TestTemplateUse: the manager counts the sandboxes created of each
// template, and finds a template as a create would.
func TestTemplateUse(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	if n, last := m.Use("base"); n != 0 || !last.IsZero() {
		t.Errorf("base before any create: %d, %v", n, last)
	}
	create(t, m, CreateRequest{TemplateID: "base"})
	create(t, m, CreateRequest{TemplateID: "base"})
	if n, last := m.Use("base"); n != 2 || last.Before(m.Started()) {
		t.Errorf("base after two creates: %d, last %v (started %v)", n, last, m.Started())
	}
	if ts := m.Configured(); len(ts) != 1 || ts[0].Name != "base" {
		t.Errorf("configured %+v, want base", ts)
	}
	if tmpl, err := m.Lookup("base"); err != nil || tmpl.Name != "base" {
		t.Errorf("lookup of base: %+v %v", tmpl, err)
	}
	if _, err := m.Lookup("nope"); !errors.Is(err, ErrUnknownTemplate) {
		t.Errorf("lookup of nope: %v, want ErrUnknownTemplate", err)
	}
}
