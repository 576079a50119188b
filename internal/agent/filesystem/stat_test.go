package filesystem

import (
	"os"
	"os/user"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem/filesystemtest"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

func TestStat(t *testing.T) {
	_, url, home := newService(t)
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(home, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "a/b/f.txt"), []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	e := filesystemtest.Stat(t, url, "a/b/f.txt")
	if e.Name != "f.txt" || e.Type != "FILE_TYPE_FILE" || e.Size != "5" || e.Mode != 0o640 || e.Permissions != "-rw-r-----" ||
		e.Owner != me.Username || e.ModifiedTime == "" || e.SymlinkTarget != nil {
		t.Errorf("Stat a/b/f.txt: %+v", e)
	}
	if e := filesystemtest.Stat(t, url, "~"); e.Path != home || e.Type != "FILE_TYPE_DIRECTORY" {
		t.Errorf("Stat ~: %+v, want the home", e)
	}
	if e := filesystemtest.Stat(t, url, filepath.Join(home, "a")); e.Path != filepath.Join(home, "a") {
		t.Errorf("Stat of an absolute path: %+v", e)
	}
	if e := rpctest.WantError(t, url, "filesystem.Filesystem/Stat", map[string]any{"path": "nope"}, "not_found", 404); e.Message != "path '"+filepath.Join(home, "nope")+"' does not exist" {
		t.Errorf("not found: %q", e.Message)
	}
	rpctest.WantError(t, url, "filesystem.Filesystem/Stat", map[string]any{"path": "a/b/f.txt/x"}, "invalid_argument", 400)

	// Links: to a file, the file's type and the target; dangling, a link.
	os.Symlink("a/b/f.txt", filepath.Join(home, "link"))
	os.Symlink("nowhere", filepath.Join(home, "dangling"))
	if e := filesystemtest.Stat(t, url, "link"); e.Type != "FILE_TYPE_FILE" || e.SymlinkTarget == nil || *e.SymlinkTarget != filepath.Join(home, "a/b/f.txt") {
		t.Errorf("Stat of a link: %+v", e)
	}
	if e := filesystemtest.Stat(t, url, "dangling"); e.Type != "FILE_TYPE_SYMLINK" || e.SymlinkTarget == nil || *e.SymlinkTarget != filepath.Join(home, "nowhere") {
		t.Errorf("Stat of a dangling link: %+v", e)
	}
}
