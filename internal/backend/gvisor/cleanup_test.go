package gvisor

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend/backendtest"
)

// stateBackend is a backend in a temporary state directory that never
// needs its runsc: what it removes left no runsc state.
func stateBackend(t *testing.T) *Backend {
	airlocktest.RequiresRoot(t) // Cleanup unmounts what a bundle may hold
	return New("/nonexistent/runsc", t.TempDir(), slog.New(slog.DiscardHandler))
}

// makeBundle makes the directory and lock file of bundle id, locked
// (held) or not; saved ones have the marker.
func makeBundle(t *testing.T, be *Backend, id string, held, saved bool) string {
	t.Helper()
	dir := filepath.Join(be.stateDir, "bundles", id)
	if err := os.MkdirAll(filepath.Join(dir, checkpointDir), 0o700); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if held {
		unix.Flock(int(lock.Fd()), unix.LOCK_EX)
		t.Cleanup(func() { lock.Close() })
	} else {
		lock.Close()
	}
	if saved {
		os.WriteFile(filepath.Join(dir, savedMarker), nil, 0o600)
	}
	return dir
}

// Cleanup removes the bundles of dead sandboxes, and leaves the live
// ones, the saved ones (for Restore or Forget) and the /etc copies being
// built now; old half-built copies go.
func TestCleanupLeavesLiveAndSaved(t *testing.T) {
	be := stateBackend(t)
	dead := makeBundle(t, be, "000000000000dead", false, false)
	live := makeBundle(t, be, "000000000000a11e", true, false)
	saved := makeBundle(t, be, "00000000000005ed", false, true)
	os.MkdirAll(filepath.Join(be.stateDir, "state", "000000000000dead"), 0o700)
	oldEtc, newEtc := filepath.Join(be.stateDir, "etc", ".new-old"), filepath.Join(be.stateDir, "etc", ".new-now")
	os.MkdirAll(oldEtc, 0o700)
	os.MkdirAll(newEtc, 0o700)
	long := time.Now().Add(-time.Hour)
	os.Chtimes(oldEtc, long, long)
	if err := be.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		dead: false, filepath.Join(be.stateDir, "state", "000000000000dead"): false,
		live: true, saved: true, filepath.Join(saved, savedMarker): true,
		oldEtc: false, newEtc: true,
	} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", strings.TrimPrefix(path, be.stateDir), err == nil, want)
		}
	}
	if got, err := be.Saved(); err != nil || !slices.Equal(got, []string{"00000000000005ed"}) {
		t.Errorf("Saved() = %v %v", got, err)
	}
}

// Forget removes a saved sandbox unless it runs; a name that is not one
// of a bundle is refused before any path is made of it.
func TestForget(t *testing.T) {
	be := stateBackend(t)
	saved := makeBundle(t, be, "00000000000005ed", false, true)
	running := makeBundle(t, be, "0000000000000123", true, true)
	for _, name := range []string{"../bundles", "", "0000000000000ABC", "00000000000005ed/..", "x"} {
		if err := be.Forget(name); err == nil || !strings.Contains(err.Error(), "no saved sandbox") {
			t.Errorf("Forget(%q): %v", name, err)
		}
		if _, err := be.Restore(t.Context(), name, backendtest.TestPolicy(), nil); err == nil || !strings.Contains(err.Error(), "no saved sandbox") {
			t.Errorf("Restore(%q): %v", name, err)
		}
	}
	if err := be.Forget("0000000000000123"); err == nil || !strings.Contains(err.Error(), "is running") {
		t.Errorf("Forget of a running sandbox: %v", err)
	}
	if _, err := os.Stat(running); err != nil {
		t.Errorf("a running sandbox's bundle went: %v", err)
	}
	if err := be.Forget("00000000000005ed"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(saved); !os.IsNotExist(err) {
		t.Errorf("the forgotten bundle is still there: %v", err)
	}
	if err := be.Forget("00000000000005ed"); err != nil {
		t.Errorf("Forget of what is gone: %v", err)
	}
	// A bundle without the marker is no saved sandbox; one whose state has
	// no stamp is refused before runsc sees it.
	makeBundle(t, be, "00000000000000aa", false, false)
	if _, err := be.Restore(t.Context(), "00000000000000aa", backendtest.TestPolicy(), nil); err == nil || !strings.Contains(err.Error(), "no saved sandbox") {
		t.Errorf("Restore of an unsaved bundle: %v", err)
	}
	makeBundle(t, be, "00000000000000bb", false, true)
	if _, err := be.Restore(t.Context(), "00000000000000bb", backendtest.TestPolicy(), nil); err == nil || !strings.Contains(err.Error(), "no stamp") {
		t.Errorf("Restore of an unstamped save: %v", err)
	}
}
