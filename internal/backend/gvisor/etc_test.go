package gvisor

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// The copy of /etc holds only what uid 1000 could read of the host's
// entries, writable by no one but root, and is made once.
func TestEtcCopy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root): it reads all of /etc")
	}
	stateDir := t.TempDir()
	dir, _, err := etcDir(stateDir, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	copied := 0
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel := strings.TrimPrefix(path, dir+"/")
		fi, _ := d.Info()
		if fi.Mode()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s is writable by others: %v", rel, fi.Mode())
		}
		if _, ok := layout.GeneratedEtc(false)[rel]; ok {
			return nil
		}
		host, err := os.Lstat("/etc/" + rel)
		if err != nil {
			t.Errorf("%s is not on the host", rel)
			return nil
		}
		if host.Mode()&fs.ModeSymlink == 0 && !sandboxVisible(host) {
			t.Errorf("%s is copied, but uid 1000 could not read it: %v", rel, host.Mode())
		}
		copied++
		return nil
	})
	if copied < 10 {
		t.Errorf("only %d entries copied", copied)
	}
	// What the sandbox could not read stays out (Debian's private key
	// directory is root:ssl-cert 0710).
	if fi, err := os.Stat("/etc/ssl/private"); err == nil && !sandboxVisible(fi) {
		if _, err := os.Lstat(filepath.Join(dir, "ssl/private")); err == nil {
			t.Error("/etc/ssl/private was copied")
		}
	}
	again, _, err := etcDir(stateDir, false, nil)
	if err != nil || again != dir {
		t.Errorf("second call: %q %v, want the same copy %q", again, err, dir)
	}
}
