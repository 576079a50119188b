package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
)

// A pause that keeps only the files ends the box and stores its file
// state; a resume starts a new box of the template, gives it the files
// and the environment again, and it is the same sandbox.
func TestFilesOnlyPauseAndResume(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{EnvVars: map[string]string{"A": "1"}})
	first := instance(sb)
	writeHome(t, first, "notes", "kept")
	if err := m.Pause(t.Context(), sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if got := sb.State(); got != SavedFiles || got.E2B() != "paused" {
		t.Fatalf("after the pause: %s, want saved-files", got)
	}
	removed(t, first)
	if !first.Killed() {
		t.Error("the box of a sandbox that kept its files was not killed")
	}
	if rec := readRecord(t, m, sb.ID); rec.Saved != savedFiles || rec.Env["A"] != "1" {
		t.Errorf("record %+v", rec)
	}
	if _, err := os.Stat(m.filesPath(sb.ID)); err != nil {
		t.Fatalf("its files: %v", err)
	}
	starts := b.Starts()
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if sb.State() != Running || b.Starts() != starts+1 {
		t.Fatalf("after the resume: %s, %d starts; want running on a new box", sb.State(), b.Starts()-starts)
	}
	second := instance(sb)
	if got := readHome(t, second, "notes"); got != "kept" {
		t.Errorf("the file holds %q", got)
	}
	if got := second.Env(); got["A"] != "1" {
		t.Errorf("the new box's environment %v", got)
	}
	if _, err := os.Stat(m.filesPath(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("its files after the resume: %v, want removed", err)
	}
	noRecord(t, m, sb.ID)
}

// At the end of its time to live, a sandbox that asked for it keeps only
// its files.
func TestAutoPauseKeepsOnlyTheFiles(t *testing.T) {
	m, _ := persistent(t, Config{})
	sb := create(t, m, CreateRequest{TTL: time.Minute, AutoPause: true, AutoPauseFiles: true})
	if got := sb.OnTimeout(); got != "pause" {
		t.Errorf("OnTimeout() = %q, want pause", got)
	}
	clockOf(m).Advance(time.Minute)
	if got := sb.State(); got != SavedFiles {
		t.Fatalf("at the end of its time to live: %s, want saved-files", got)
	}
}

// A pause that keeps only the files is refused where it cannot keep
// them: no state directory, a template of the image store, a network.
func TestFilesOnlyPauseRefusals(t *testing.T) {
	m, _ := newManager(t, Config{}, 0)
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, false); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "state directory") {
		t.Errorf("without a state directory: %v", err)
	}
	if sb.State() != Running || instance(sb).Paused() {
		t.Errorf("a refused pause left it %s", sb.State())
	}
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base", AutoPause: true, AutoPauseFiles: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a create asking for it without a state directory: %v", err)
	}
	pm, _ := persistent(t, Config{})
	if err := pm.filesPausable("an-image"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "base and code-interpreter-v1") {
		t.Errorf("a template of the image store: %v", err)
	}
	if err := pm.filesPausable("base"); err != nil {
		t.Errorf("a sandbox of base: %v", err)
	}
}

// Files the agent could not all read, or more than the sandbox's disk
// holds, are not kept: the pause fails, and the sandbox runs on.
func TestFilesOnlyPauseFailures(t *testing.T) {
	t.Run("unreadable", func(t *testing.T) {
		m, b := persistent(t, Config{})
		sb := create(t, m, CreateRequest{})
		b.SetError(fake.OpFiles, errors.New("unreadable"))
		if err := m.Pause(t.Context(), sb.ID, false); err == nil || !strings.Contains(err.Error(), "could not read all") {
			t.Fatalf("pause: %v", err)
		}
		runsOn(t, m, sb)
	})
	t.Run("larger than its disk", func(t *testing.T) {
		m, _ := persistent(t, Config{})
		sb := create(t, m, CreateRequest{Limits: Limits{DiskBytes: minRequestDisk}})
		writeHome(t, instance(sb), "big", strings.Repeat("x", 2*minRequestDisk))
		if err := m.Pause(t.Context(), sb.ID, false); err == nil || !strings.Contains(err.Error(), "larger than its disk") {
			t.Fatalf("pause: %v", err)
		}
		runsOn(t, m, sb)
	})
}

// runsOn checks that sb, whose pause failed, runs on, nothing of the
// pause left behind.
func runsOn(t *testing.T, m *Manager, sb *Sandbox) {
	t.Helper()
	if sb.State() != Running {
		t.Errorf("after a failed pause: %s, want running", sb.State())
	}
	if err := warm(t.Context(), instance(sb)); err != nil {
		t.Errorf("its agent: %v", err)
	}
	entries, _ := os.ReadDir(m.savedDir())
	for _, e := range entries {
		t.Errorf("left in the saved directory: %s", e.Name())
	}
}

// A resume whose new box cannot start keeps the files for another try.
func TestFilesOnlyResumeFailureKeepsTheFiles(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{})
	if err := m.Pause(t.Context(), sb.ID, false); err != nil {
		t.Fatal(err)
	}
	b.SetStartError(errors.New("no box"))
	if err := m.Resume(t.Context(), sb.ID, 0); !errors.Is(err, ErrUnrestorable) {
		t.Fatalf("resume without a box: %v, want ErrUnrestorable", err)
	}
	if sb.State() != SavedFiles {
		t.Errorf("after a failed resume: %s", sb.State())
	}
	if _, err := os.Stat(m.filesPath(sb.ID)); err != nil {
		t.Errorf("its files after a failed resume: %v", err)
	}
	b.SetStartError(nil)
	if err := m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	// Killed, what a new pause saves goes with it.
	if err := m.Pause(t.Context(), sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(sb.ID); err != nil {
		t.Fatal(err)
	}
	<-sb.Done()
	if _, err := os.Stat(m.filesPath(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("its files after a kill: %v, want removed", err)
	}
	noRecord(t, m, sb.ID)
	if _, err := os.Stat(filepath.Join(m.cfg.StateDir, "saved")); err != nil {
		t.Errorf("the saved directory: %v", err)
	}
}

// A reboot (connect's onResume 'reboot') of a sandbox paused with its
// memory starts it again from its files: a new box, nothing of the
// frozen one. One that cannot keep only its files stays paused.
func TestReboot(t *testing.T) {
	m, b := persistent(t, Config{})
	sb := create(t, m, CreateRequest{})
	first := instance(sb)
	writeHome(t, first, "notes", "kept")
	if err := m.Pause(t.Context(), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	starts := b.Starts()
	if err := m.Reboot(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	// A fresh start (not a restore of what the pause kept).
	if sb.State() != Running || b.Starts() != starts+1 || instance(sb) == first {
		t.Fatalf("after the reboot: %s, %d starts; want running on a newly started box", sb.State(), b.Starts()-starts)
	}
	if got := readHome(t, instance(sb), "notes"); got != "kept" {
		t.Errorf("the file holds %q", got)
	}

	m2, b2 := newManager(t, Config{}, 0) // no state directory: no files-only pause
	sb2 := create(t, m2, CreateRequest{})
	if err := m2.Pause(t.Context(), sb2.ID, true); err != nil {
		t.Fatal(err)
	}
	starts = b2.Starts()
	if err := m2.Reboot(t.Context(), sb2.ID, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("a reboot without a state directory: %v, want ErrInvalid", err)
	}
	if !sb2.Paused() || b2.Starts() != starts {
		t.Errorf("a refused reboot left it %s, %d boxes started", sb2.State(), b2.Starts()-starts)
	}
}
