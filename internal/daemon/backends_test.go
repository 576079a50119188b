package daemon

import (
	"log/slog"
	"os"
	"strings"
	"testing"
)

// A state directory others can enter is closed to them; one another user
// owns is refused: it holds the API key.
func TestStateDirMode(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if err := openStateDir(t.Context(), dir, newBackends(dir, "", nil, log), log); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory left at mode %04o, want 0700", fi.Mode().Perm())
	}
	if os.Geteuid() != 0 {
		return
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := openStateDir(t.Context(), dir, newBackends(dir, "", nil, log), log); err == nil || !strings.Contains(err.Error(), "owned") {
		t.Errorf("a state directory owned by nobody: %v, want a refusal", err)
	}
}
