package sandbox

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// source is a TemplateSource a test adds templates to.
type source struct {
	mu sync.Mutex
	m  map[string]Template
}

func (s *source) Template(name string) (Template, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.m[name]
	if !ok {
		return Template{}, fmt.Errorf("%w %q", ErrUnknownTemplate, name)
	}
	return t, nil
}

func (s *source) set(t Template) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]Template{}
	}
	s.m[t.Name] = t
}

// A snapshot copies a running sandbox, which runs on; a template of the
// copy starts sandboxes as it was: its files, its environment.
func TestSnapshotAndCreateFromIt(t *testing.T) {
	src := &source{}
	m, b := persistent(t, Config{Source: src})
	sb := create(t, m, CreateRequest{EnvVars: map[string]string{"A": "1"}, Metadata: map[string]string{"k": "v"}})
	box := instance(sb)
	writeHome(t, box, "f", "as it was")
	dir := filepath.Join(t.TempDir(), "snap")
	of, err := m.Snapshot(t.Context(), sb.ID, dir)
	if err != nil {
		t.Fatal(err)
	}
	if of.Sandbox != sb.ID || of.Template != "base" || of.Backend != Backend(b) || of.Policy.MemoryBytes != sb.pol.MemoryBytes || !maps.Equal(of.Metadata, sb.Metadata) {
		t.Errorf("SnapshotOf %+v", of)
	}
	if sb.State() != Running || instance(sb) != box {
		t.Fatalf("after the snapshot: %s, box kept %v", sb.State(), instance(sb) == box)
	}
	if err := warm(t.Context(), box); err != nil {
		t.Fatalf("the snapshotted sandbox's agent: %v", err)
	}
	tmpl := of.template(dir)
	tmpl.Name = "snap"
	src.set(tmpl)
	c := create(t, m, CreateRequest{TemplateID: "snap"})
	if b.Clones() != 1 || instance(c) == box {
		t.Fatalf("%d clones, want the sandbox cloned", b.Clones())
	}
	if got := readHome(t, instance(c), "f"); got != "as it was" {
		t.Errorf("the clone's file holds %q", got)
	}
	if got := instance(c).Env(); got["A"] != "1" {
		t.Errorf("the clone's environment %v", got)
	}
	if c.ID == sb.ID || c.AccessToken == sb.AccessToken {
		t.Error("the clone shares the original's id or token")
	}
	// A sandbox from a snapshot may have a network: on a server that
	// gives none, it is refused as any other.
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "snap", Network: policy.Network{Mode: policy.NetInternet}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no network") {
		t.Errorf("a networked sandbox from a snapshot on a server without networks: %v", err)
	}
	// A snapshot that cannot start is the client's to delete.
	b.SetError(fake.OpClone, errors.New("corrupt"))
	_, err = m.Create(t.Context(), CreateRequest{TemplateID: "snap"})
	var ue *UnrestorableError
	if !errors.As(err, &ue) || !ue.Snapshot || !strings.Contains(ue.Public(), "snapshot snap") {
		t.Errorf("a snapshot that cannot start: %v", err)
	}
}

func TestSnapshotRefusals(t *testing.T) {
	m, b := persistent(t, Config{PauseInMemory: true})
	dir := func() string { return filepath.Join(t.TempDir(), "snap") }
	if _, err := m.Snapshot(t.Context(), "nope", dir()); !errors.Is(err, ErrNotFound) {
		t.Errorf("an unknown sandbox: %v", err)
	}
	paused := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), paused.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshot(t.Context(), paused.ID, dir()); !errors.Is(err, ErrConflict) {
		t.Errorf("a paused sandbox: %v, want ErrConflict", err)
	}
	sb := create(t, m, CreateRequest{})
	b.SetError(fake.OpSnapshot, errors.New("disk full"))
	if _, err := m.Snapshot(t.Context(), sb.ID, dir()); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("a failed snapshot: %v", err)
	}
	if sb.State() != Running {
		t.Errorf("after a failed snapshot: %s", sb.State())
	}
	if err := warm(t.Context(), instance(sb)); err != nil {
		t.Errorf("its agent after a failed snapshot: %v", err)
	}
	if err := m.Kill(sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Snapshot(t.Context(), sb.ID, dir()); !errors.Is(err, ErrNotFound) {
		t.Errorf("a killed sandbox: %v", err)
	}
	// One found before the kill, and snapshotted after it.
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	_, err := m.Snapshot(t.Context(), sb.ID, dir())
	m.mu.Lock()
	delete(m.sandboxes, sb.ID)
	m.mu.Unlock()
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("a killed sandbox found before the kill: %v", err)
	}

	// A backend that cannot copy a running sandbox.
	pm, _ := newManager(t, Config{AllowRequestBackend: true, Backends: map[string]Backend{"plain": plain{fake.New(t.TempDir(), nil)}}}, 0)
	other := create(t, pm, CreateRequest{Backend: "plain"})
	if _, err := pm.Snapshot(t.Context(), other.ID, dir()); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "gvisor backend can") {
		t.Errorf("on a backend that cannot: %v", err)
	}
	tmpl := Template{Name: "snap", Policy: policy.Default(), Backend: plain{fake.New(t.TempDir(), nil)}, Snapshot: dir()}
	if _, err := pm.create(t.Context(), CreateRequest{TemplateID: "snap"}, &tmpl, nil, pm.clock.Now()); !errors.Is(err, ErrInvalid) {
		t.Errorf("a snapshot's template on a backend that cannot clone: %v", err)
	}
}

// A fork makes copies of a running sandbox from one snapshot, each a
// sandbox of its own inheriting what the original's client set; the
// snapshot is gone once they run.
func TestFork(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{ClientID: "c", Metadata: map[string]string{"k": "v"}, AutoPause: true, AutoResume: true, Ingress: Ingress{MaskHost: "h"}})
	writeHome(t, instance(sb), "f", "forked")
	out, err := m.Fork(t.Context(), sb.ID, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{sb.ID: true}
	for i, r := range out {
		if r.Err != nil {
			t.Fatalf("fork %d: %v", i, r.Err)
		}
		f := r.Sandbox
		if ids[f.ID] {
			t.Errorf("fork %d has an id already taken: %s", i, f.ID)
		}
		ids[f.ID] = true
		if f.ClientID != "c" || !f.AutoResume || f.OnTimeout() != "pause" || f.Ingress.MaskHost != "h" || f.TemplateID != "base" || !maps.Equal(f.Metadata, sb.Metadata) {
			t.Errorf("fork %d: %+v, want what the original's client set", i, f)
		}
		if got := readHome(t, instance(f), "f"); got != "forked" {
			t.Errorf("fork %d's file holds %q", i, got)
		}
	}
	out[0].Sandbox.Metadata["k"] = "changed"
	if sb.Metadata["k"] != "v" || out[1].Sandbox.Metadata["k"] != "v" {
		t.Error("forks share their metadata")
	}
	if sb.State() != Running {
		t.Errorf("the original after the fork: %s", sb.State())
	}
	if b.Clones() != 3 {
		t.Errorf("%d clones, want 3", b.Clones())
	}
	if entries, _ := os.ReadDir(filepath.Join(m.cfg.StateDir, "forks")); len(entries) != 0 {
		t.Errorf("the fork's snapshot is left: %v", entries)
	}
}

// A fork makes as many copies as E2B's API allows, 100, a few at a time:
// each copy checks the host's room before it starts, which copies
// started all at once would pass together before any used memory.
func TestForkHundred(t *testing.T) {
	if MaxForks != 100 {
		t.Fatalf("MaxForks %d, want E2B's 100", MaxForks)
	}
	var mu sync.Mutex
	armed, inside, most := false, 0, 0
	gate := make(chan struct{})
	m, b := persistent(t, Config{HostRoom: func() error {
		mu.Lock()
		if !armed { // the original's create
			mu.Unlock()
			return nil
		}
		inside++
		most = max(most, inside)
		if inside == forkParallel() {
			close(gate) // as many as may be at once are: let them all go
		}
		mu.Unlock()
		<-gate
		mu.Lock()
		inside--
		mu.Unlock()
		return nil
	}})
	sb := create(t, m, CreateRequest{})
	writeHome(t, instance(sb), "f", "forked")
	mu.Lock()
	armed = true
	mu.Unlock()
	out, err := m.Fork(t.Context(), sb.ID, MaxForks, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i, r := range out {
		if r.Err != nil {
			t.Fatalf("fork %d: %v", i, r.Err)
		}
		ids[r.Sandbox.ID] = true
		if got := readHome(t, instance(r.Sandbox), "f"); got != "forked" {
			t.Errorf("fork %d's file holds %q", i, got)
		}
	}
	if len(ids) != MaxForks || b.Clones() != MaxForks {
		t.Errorf("%d distinct sandboxes from %d clones, want %d", len(ids), b.Clones(), MaxForks)
	}
	if most != forkParallel() {
		t.Errorf("%d copies started at once, want %d", most, forkParallel())
	}
}

// Copies that the host has no room for fail each with why; those it has
// room for start.
func TestForkBoundedByTheHost(t *testing.T) {
	var mu sync.Mutex
	room := 11 // the original, and ten copies
	m, _ := persistent(t, Config{HostRoom: func() error {
		mu.Lock()
		defer mu.Unlock()
		if room == 0 {
			return &PublicError{Err: ErrHostFull, Cause: errors.New("test")}
		}
		room--
		return nil
	}})
	sb := create(t, m, CreateRequest{})
	out, err := m.Fork(t.Context(), sb.ID, MaxForks, 0)
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	for i, r := range out {
		switch {
		case r.Err == nil:
			made++
		case !errors.Is(r.Err, ErrHostFull):
			t.Errorf("fork %d: %v, want ErrHostFull", i, r.Err)
		}
	}
	if made != 10 {
		t.Errorf("%d copies made, want the 10 the host had room for", made)
	}
}

func TestForkRefusalsAndFailures(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{})
	for _, count := range []int{0, -1, MaxForks + 1} {
		if _, err := m.Fork(t.Context(), sb.ID, count, 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("count %d: %v, want ErrInvalid", count, err)
		}
	}
	if _, err := m.Fork(t.Context(), sb.ID, 1, -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("a negative time to live: %v", err)
	}
	if _, err := m.Fork(t.Context(), "nope", 1, 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("an unknown sandbox: %v", err)
	}
	b.SetError(fake.OpClone, errors.New("no"))
	out, err := m.Fork(t.Context(), sb.ID, 2, 0)
	if err != nil {
		t.Fatalf("the snapshot: %v", err)
	}
	for i, r := range out {
		var ue *UnrestorableError
		if r.Sandbox != nil || !errors.As(r.Err, &ue) || !ue.Snapshot {
			t.Errorf("fork %d: %v, %v; want an UnrestorableError", i, r.Sandbox, r.Err)
		}
	}
	if n := len(m.List(nil)); n != 1 {
		t.Errorf("%d sandboxes after failed forks, want the original", n)
	}
}

// Without a state directory, a fork's snapshot goes to a temporary
// directory, removed with it.
func TestForkWithoutStateDir(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{})
	dir, err := m.scratchDir("forks")
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir)
	if !strings.Contains(filepath.Base(dir), "airlock-forks-") {
		t.Errorf("scratch directory %s", dir)
	}
	out, err := m.Fork(t.Context(), sb.ID, 1, 0)
	if err != nil || out[0].Err != nil {
		t.Fatalf("fork: %v %v", err, out[0].Err)
	}
}
