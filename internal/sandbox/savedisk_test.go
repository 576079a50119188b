package sandbox

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/fake"
)

// persistent returns a manager whose sandboxes a pause saves to disk, as
// gVisor's are, with a state directory of its own.
func persistent(t *testing.T, cfg Config, setup ...func(*fake.Backend)) (*Manager, *fake.Backend) {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	return newManager(t, cfg, 0, setup...)
}

func writeHome(t *testing.T, inst *fake.Instance, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(inst.Home(), name), []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readHome(t *testing.T, inst *fake.Instance, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(inst.Home(), name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return string(data)
}

func readRecord(t *testing.T, m *Manager, id string) savedRecord {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(m.savedDir(), id+".json"))
	if err != nil {
		t.Fatalf("record of %s: %v", id, err)
	}
	var rec savedRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func noRecord(t *testing.T, m *Manager, id string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(m.savedDir(), id+".json")); !os.IsNotExist(err) {
		t.Errorf("the record of %s: %v, want none", id, err)
	}
}

// A pause on a backend that saves ends the box and frees its memory; the
// sandbox stays, paused, with a record; a resume restores the same agent
// over the same files and it runs on as it was.
func TestPauseToDiskAndResume(t *testing.T) {
	m, b := persistent(t, Config{})
	clock := clockOf(m)
	sb := create(t, m, CreateRequest{EnvVars: map[string]string{"A": "1"}, Metadata: map[string]string{"k": "v"}})
	first := instance(sb)
	writeHome(t, first, "work", "kept")
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if got := sb.State(); got != Saved || !sb.Paused() || got.E2B() != "paused" {
		t.Fatalf("after the pause: %s (paused %v), want saved", got, sb.Paused())
	}
	<-first.Done()
	if sb.instance() != nil {
		t.Error("a saved sandbox still has a box")
	}
	if _, err := m.Get(sb.ID); err != nil {
		t.Fatalf("the saved sandbox left the registry: %v", err)
	}
	if saved, _ := b.Saved(); len(saved) != 1 {
		t.Errorf("the backend saved %v, want one", saved)
	}
	if got := m.saved.Load(); got != 1 {
		t.Errorf("%d saved, want 1", got)
	}
	rec := readRecord(t, m, sb.ID)
	if rec.ID != sb.ID || rec.AccessToken != sb.AccessToken || rec.Backend != "fake" || rec.Saved == "" || rec.Saved == savedFiles ||
		!maps.Equal(rec.Metadata, sb.Metadata) || !rec.EndAt.Equal(clock.Now().Add(time.Hour)) {
		t.Errorf("record %+v", rec)
	}
	if u, err := sb.Usage(t.Context()); err != nil || u != (Usage{}) {
		t.Errorf("a saved sandbox's usage: %+v %v, want none", u, err)
	}
	if err := m.Resume(t.Context(), sb.ID, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := sb.State(); got != Running {
		t.Fatalf("after the resume: %s, want running", got)
	}
	restored := instance(sb)
	if restored == first {
		t.Fatal("the resume kept the ended box")
	}
	if got := readHome(t, restored, "work"); got != "kept" {
		t.Errorf("restored file holds %q", got)
	}
	if got := restored.Env(); got["A"] != "1" {
		t.Errorf("restored environment %v", got)
	}
	if restored.Policy().MemoryBytes != sb.pol.MemoryBytes {
		t.Error("restored under another policy than the sandbox's")
	}
	if !sb.EndAt().Equal(clock.Now().Add(10 * time.Minute)) {
		t.Errorf("EndAt %v after a resume of 10m", sb.EndAt())
	}
	noRecord(t, m, sb.ID)
	if got := m.saved.Load(); got != 0 {
		t.Errorf("%d saved after the resume, want 0", got)
	}
	// Its box is watched again: its death ends the sandbox.
	restored.Die()
	waitFor(t, m, "the restored sandbox's death ends it", gone(m, sb.ID))
}

// A saved sandbox counts against no limit; a resume needs room for it.
func TestSavedSandboxCountsAgainstNoLimit(t *testing.T) {
	m, _ := persistent(t, Config{MaxSandboxes: 1})
	a := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), a.ID, true); err != nil {
		t.Fatal(err)
	}
	other := create(t, m, CreateRequest{})
	if err := m.Resume(t.Context(), a.ID, 0); !errors.Is(err, ErrTooMany) {
		t.Fatalf("resume at the limit: %v, want ErrTooMany", err)
	}
	if a.State() != Saved {
		t.Errorf("a refused resume left it %s", a.State())
	}
	if err := m.Kill(other.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume(t.Context(), a.ID, 0); err != nil {
		t.Fatalf("resume below the limit: %v", err)
	}
}

// A full host refuses a restore (a new box), not a thaw.
func TestFullHostRefusesARestore(t *testing.T) {
	var full atomic.Bool
	m, _ := persistent(t, Config{HostRoom: func() error {
		if full.Load() {
			return &PublicError{Err: ErrHostFull, Cause: errors.New("full")}
		}
		return nil
	}})
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	full.Store(true)
	if err := m.Resume(t.Context(), sb.ID, 0); !errors.Is(err, ErrHostFull) {
		t.Fatalf("restore on a full host: %v, want ErrHostFull", err)
	}
	if sb.State() != Saved {
		t.Errorf("a refused restore left it %s", sb.State())
	}
}

// A save that fails leaves the sandbox paused in memory instead.
func TestFailedSaveFallsBackToMemory(t *testing.T) {
	m, b := persistent(t, Config{})
	b.SetError(fake.OpCheckpoint, errors.New("no room on disk"))
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if got := sb.State(); got != Paused || !instance(sb).Paused() {
		t.Fatalf("after a failed save: %s, instance paused %v; want paused in memory", got, instance(sb).Paused())
	}
	noRecord(t, m, sb.ID)
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if instance(sb).Paused() || sb.State() != Running {
		t.Error("not thawed by the resume")
	}
	// Its agent listens again after the failed save.
	if err := warm(t.Context(), instance(sb)); err != nil {
		t.Errorf("the agent after a failed save: %v", err)
	}
}

// A restore that fails keeps the sandbox saved, its record and its save,
// for another try; the error is one a client may read.
func TestFailedRestoreKeepsItSaved(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	b.SetError(fake.OpRestore, &backend.StateError{Reason: "was written by another runtime"})
	err := m.Resume(t.Context(), sb.ID, 0)
	var ue *UnrestorableError
	if !errors.Is(err, ErrUnrestorable) || !errors.As(err, &ue) {
		t.Fatalf("failed restore: %v, want an UnrestorableError", err)
	}
	if pub := ue.Public(); !strings.Contains(pub, "was written by another runtime") || !strings.Contains(pub, sb.ID) {
		t.Errorf("the client is told %q", pub)
	}
	if sb.State() != Saved || m.saved.Load() != 1 {
		t.Errorf("after a failed restore: %s, %d saved; want saved, 1", sb.State(), m.saved.Load())
	}
	readRecord(t, m, sb.ID)
	b.SetError(fake.OpRestore, nil)
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatalf("another try: %v", err)
	}
}

// A kill of a saved sandbox forgets its save and its record.
func TestKillForgetsASavedSandbox(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(sb.ID); err != nil {
		t.Fatal(err)
	}
	<-sb.Done()
	if sb.State() != Gone {
		t.Errorf("killed: %s, want gone", sb.State())
	}
	if saved, _ := b.Saved(); len(saved) != 0 {
		t.Errorf("the backend still holds %v", saved)
	}
	noRecord(t, m, sb.ID)
	if m.saved.Load() != 0 {
		t.Errorf("%d saved after the kill", m.saved.Load())
	}
}

// A saved sandbox ends at the server's longest time to live, as a
// paused one does.
func TestSavedSandboxEndsAtMaxTTL(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	clockOf(m).Advance(time.Hour)
	if !gone(m, sb.ID)() {
		t.Fatal("the saved sandbox outlived the longest time to live")
	}
	if saved, _ := b.Saved(); len(saved) != 0 {
		t.Errorf("the backend still holds %v", saved)
	}
}

// PauseInMemory keeps every pause in memory, where the backend could
// save; so does a sandbox's network (its copy would carry its addresses).
func TestPauseInMemoryWhereAsked(t *testing.T) {
	m, b := persistent(t, Config{PauseInMemory: true})
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if sb.State() != Paused || !instance(sb).Paused() {
		t.Errorf("PauseInMemory: %s, want paused in memory", sb.State())
	}
	if saved, _ := b.Saved(); len(saved) != 0 {
		t.Errorf("the backend saved %v", saved)
	}
}
