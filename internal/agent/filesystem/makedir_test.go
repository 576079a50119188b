package filesystem

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem/filesystemtest"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

func TestMakeDir(t *testing.T) {
	_, url, home := newService(t)
	var made filesystemtest.Answer
	rpctest.MustUnary(t, url, "filesystem.Filesystem/MakeDir", map[string]any{"path": "a/b"}, &made)
	if e := made.Entry; e.Name != "b" || e.Type != "FILE_TYPE_DIRECTORY" || e.Path != filepath.Join(home, "a/b") {
		t.Errorf("MakeDir a/b: %+v, want the directory b in the home", e)
	}
	if fi, err := os.Stat(filepath.Join(home, "a/b")); err != nil || !fi.IsDir() {
		t.Errorf("a/b after MakeDir: %v", err)
	}
	rpctest.WantError(t, url, "filesystem.Filesystem/MakeDir", map[string]any{"path": "a/b"}, "already_exists", 409)
	if err := os.WriteFile(filepath.Join(home, "a/b/f.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rpctest.WantError(t, url, "filesystem.Filesystem/MakeDir", map[string]any{"path": "a/b/f.txt"}, "invalid_argument", 400)
	rpctest.WantError(t, url, "filesystem.Filesystem/MakeDir", map[string]any{"path": "a/b/f.txt/c"}, "invalid_argument", 400)
}
