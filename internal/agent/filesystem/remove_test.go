package filesystem

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

func TestRemove(t *testing.T) {
	_, url, home := newService(t)
	if err := os.MkdirAll(filepath.Join(home, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, "a/b/f"), nil, 0o644)
	rpctest.MustUnary(t, url, "filesystem.Filesystem/Remove", map[string]any{"path": "a"}, nil)
	if _, err := os.Stat(filepath.Join(home, "a")); !os.IsNotExist(err) {
		t.Errorf("a after Remove: %v", err)
	}
	rpctest.MustUnary(t, url, "filesystem.Filesystem/Remove", map[string]any{"path": "a"}, nil) // gone already: as envd, no error
}
