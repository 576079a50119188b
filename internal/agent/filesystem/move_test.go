package filesystem

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem/filesystemtest"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

func TestMove(t *testing.T) {
	_, url, home := newService(t)
	if err := os.WriteFile(filepath.Join(home, "f.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	var moved filesystemtest.Answer
	rpctest.MustUnary(t, url, "filesystem.Filesystem/Move", map[string]any{"source": "f.txt", "destination": "c/g.txt"}, &moved)
	if moved.Entry.Path != filepath.Join(home, "c/g.txt") || moved.Entry.Size != "5" {
		t.Errorf("Move: %+v, want c/g.txt, its parent made", moved.Entry)
	}
	if _, err := os.Stat(filepath.Join(home, "f.txt")); !os.IsNotExist(err) {
		t.Errorf("the source after Move: %v", err)
	}
	rpctest.WantError(t, url, "filesystem.Filesystem/Move", map[string]any{"source": "nope", "destination": "x"}, "not_found", 404)
	// A directory onto a non-empty one is the kernel's refusal.
	os.MkdirAll(filepath.Join(home, "d/e"), 0o755)
	if e := rpctest.Unary(t, url, "filesystem.Filesystem/Move", map[string]any{"source": "c", "destination": "d"}, nil); e == nil {
		t.Error("moving a directory onto a non-empty one succeeded")
	}
}
