package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// restartable is the configuration of managers that, one after the
// other, keep their saved sandboxes in dir, on backend b (by its name,
// "fake") or on the others named.
func restartable(dir string, b *fake.Backend, others map[string]Backend) Config {
	return Config{StateDir: dir, BackendByName: func(name string) (Backend, error) {
		if name == b.Name() {
			return b, nil
		}
		if o, ok := others[name]; ok {
			return o, nil
		}
		return nil, fmt.Errorf("no backend %q", name)
	}}
}

// Sandboxes saved to disk, whole or their files, outlive their manager:
// the next one finds them, paused, the same sandboxes (ids, tokens,
// metadata), and resumes them.
func TestSavedSandboxesOutliveTheManager(t *testing.T) {
	b := fake.New(t.TempDir(), testLog(t))
	cfg := restartable(t.TempDir(), b, nil)
	m1 := managerOn(t, cfg, 0, b)
	disk := create(t, m1, CreateRequest{Metadata: map[string]string{"kind": "disk"}, AutoResume: true})
	files := create(t, m1, CreateRequest{Metadata: map[string]string{"kind": "files"}, EnvVars: map[string]string{"A": "1"}})
	running := create(t, m1, CreateRequest{})
	writeHome(t, instance(disk), "f", "from disk")
	writeHome(t, instance(files), "f", "from files")
	if err := m1.Pause(t.Context(), disk.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := m1.Pause(t.Context(), files.ID, false); err != nil {
		t.Fatal(err)
	}
	runningBox := instance(running)
	m1.Shutdown()
	if !runningBox.Waited() {
		t.Error("Shutdown left a running sandbox's box")
	}
	if saved, _ := b.Saved(); len(saved) != 1 {
		t.Fatalf("Shutdown left the backend %v, want the saved sandbox", saved)
	}

	m2 := managerOn(t, cfg, 0, b)
	found := map[string]*Sandbox{}
	for _, sb := range m2.List(nil) {
		found[sb.ID] = sb
	}
	if len(found) != 2 || found[disk.ID] == nil || found[files.ID] == nil {
		t.Fatalf("the next manager found %v, want the two saved sandboxes", slices.Collect(maps.Keys(found)))
	}
	for _, tc := range []struct {
		was   *Sandbox
		state State
	}{{disk, Saved}, {files, SavedFiles}} {
		sb := found[tc.was.ID]
		if sb.State() != tc.state || !sb.Paused() {
			t.Errorf("%s found %s, want %s", tc.was.Metadata["kind"], sb.State(), tc.state)
		}
		if !sb.CheckToken(tc.was.AccessToken) || !sb.CheckTrafficToken(tc.was.TrafficToken) ||
			!maps.Equal(sb.Metadata, tc.was.Metadata) || sb.AutoResume != tc.was.AutoResume || !sb.StartedAt.Equal(tc.was.StartedAt) {
			t.Errorf("%s found as %+v, want it as it was", tc.was.Metadata["kind"], sb)
		}
		if err := m2.Resume(t.Context(), sb.ID, 0); err != nil {
			t.Fatalf("resume %s: %v", tc.was.Metadata["kind"], err)
		}
		if got := readHome(t, instance(sb), "f"); got != "from "+tc.was.Metadata["kind"] {
			t.Errorf("%s's file holds %q", tc.was.Metadata["kind"], got)
		}
	}
	if got := instance(found[files.ID]).Env(); got["A"] != "1" {
		t.Errorf("the environment set again after a restart: %v", got)
	}
	if m2.saved.Load() != 0 {
		t.Errorf("%d saved after both resumed", m2.saved.Load())
	}
}

// A saved sandbox whose time ran out while no daemon ran ends as soon
// as the next one starts.
func TestSavedSandboxExpiredWhileDown(t *testing.T) {
	b := fake.New(t.TempDir(), testLog(t))
	cfg := restartable(t.TempDir(), b, nil)
	m1 := managerOn(t, cfg, 0, b)
	sb := create(t, m1, CreateRequest{})
	if err := m1.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	m1.Shutdown()
	later := newFakeClock()
	later.Advance(2 * time.Hour) // past the record's end, an hour after the pause
	cfg.Clock = later
	m2 := managerOn(t, cfg, 0, b)
	if _, err := m2.Get(sb.ID); err != nil {
		t.Fatalf("the next manager did not find it: %v", err)
	}
	later.Advance(0)
	if !gone(m2, sb.ID)() {
		t.Fatal("a saved sandbox past its end outlived the restart")
	}
	if saved, _ := b.Saved(); len(saved) != 0 {
		t.Errorf("the backend still holds %v", saved)
	}
	noRecord(t, m2, sb.ID)
}

// plain is a backend that restores nothing.
type plain struct{ Backend }

func writeTestJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A starting manager registers what its records describe, and leaves out
// what it cannot use, logging why: a record unreadable or of another
// name, of a backend it lacks or one that restores nothing, of files that
// are missing. Files and saves no record names are a daemon's that died
// while saving them, and are removed; so is every fork's and warm
// snapshot's scratch directory.
func TestLoadSavedLeavesOutWhatItCannotUse(t *testing.T) {
	dir := t.TempDir()
	saved := filepath.Join(dir, "saved")
	for _, d := range []string{saved, filepath.Join(dir, "forks", "x"), filepath.Join(dir, "warm", "y")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	id := func(n int) string { return fmt.Sprintf("i%019d", n) }
	rec := func(n int, backend, savedName string) savedRecord {
		return savedRecord{ID: id(n), TemplateID: "base", Backend: backend, Saved: savedName, Policy: policy.Default()}
	}
	os.WriteFile(filepath.Join(saved, "notes.txt"), []byte("not a record"), 0o600)
	os.WriteFile(filepath.Join(saved, id(1)+".json"), []byte("{"), 0o600)
	writeTestJSON(t, filepath.Join(saved, id(2)+".json"), rec(3, "fake", savedFiles)) // another's name
	writeTestJSON(t, filepath.Join(saved, id(4)+".json"), rec(4, "fake", ""))         // not saved
	writeTestJSON(t, filepath.Join(saved, id(5)+".json"), rec(5, "nope", "x"))
	writeTestJSON(t, filepath.Join(saved, id(6)+".json"), rec(6, "plain", "x"))
	writeTestJSON(t, filepath.Join(saved, id(7)+".json"), rec(7, "fake", savedFiles)) // its files missing
	writeTestJSON(t, filepath.Join(saved, id(8)+".json"), rec(8, "fake", savedFiles))
	for _, name := range []string{id(8) + ".tar", id(9) + ".tar", "." + id(10) + ".tar.new"} {
		os.WriteFile(filepath.Join(saved, name), nil, 0o600)
	}
	// A gVisor save of no record's: the backend saved, the daemon died.
	gv := fake.New(t.TempDir(), nil)
	orphan, err := gv.Start(t.Context(), policy.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm(t.Context(), orphan); err != nil { // it answers …
		t.Fatal(err)
	}
	if err := postAgent(t.Context(), orphan, (*agentproto.Client).Checkpoint, 10*time.Second); err != nil { // … and lets go
		t.Fatal(err)
	}
	if _, err := orphan.(backend.Checkpointer).Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}

	b := fake.New(t.TempDir(), testLog(t))
	m := managerOn(t, restartable(dir, b, map[string]Backend{"plain": plain{b}, "gvisor": gv, "namespaces": plain{b}}), 0, b)
	var ids []string
	for _, sb := range m.List(nil) {
		ids = append(ids, sb.ID)
	}
	if !slices.Equal(ids, []string{id(8)}) {
		t.Errorf("registered %v, want only %s", ids, id(8))
	}
	for name, want := range map[string]bool{
		"notes.txt": true, id(1) + ".json": true, id(8) + ".json": true, id(8) + ".tar": true,
		id(9) + ".tar": false, "." + id(10) + ".tar.new": false,
	} {
		if _, err := os.Stat(filepath.Join(saved, name)); (err == nil) != want {
			t.Errorf("%s: %v, want kept %v", name, err, want)
		}
	}
	for _, d := range []string{"forks", "warm"} {
		if _, err := os.Stat(filepath.Join(dir, d)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed", d, err)
		}
	}
	if left, _ := gv.Saved(); len(left) != 0 {
		t.Errorf("the gvisor backend still holds %v, which no record names", left)
	}
	if m.saved.Load() != 1 {
		t.Errorf("%d saved, want 1", m.saved.Load())
	}
	orphan.Wait()
}

// Without a state directory, nothing outlives the manager, and nothing
// is read at its start.
func TestNoStateDirNoRecords(t *testing.T) {
	m, b := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(context.Background(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if sb.State() != Saved {
		t.Fatalf("paused: %s, want saved (the backend can)", sb.State())
	}
	if err := m.writeRecord(sb); err != nil {
		t.Errorf("writeRecord without a state directory: %v", err)
	}
	if m.StateDir() != "" {
		t.Errorf("StateDir() = %q", m.StateDir())
	}
	if saved, _ := b.Saved(); len(saved) != 1 {
		t.Errorf("the backend holds %v", saved)
	}
}
