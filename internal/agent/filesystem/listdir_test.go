package filesystem

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/filesystem/filesystemtest"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

func TestListDir(t *testing.T) {
	_, url, home := newService(t)
	if err := os.MkdirAll(filepath.Join(home, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, "a/b/f.txt"), nil, 0o644)
	os.Symlink("a/b/f.txt", filepath.Join(home, "link"))
	for _, tc := range []struct {
		path  string
		depth int
		want  []string
	}{
		{"a", 1, []string{"a/b"}},
		{"a", 0, []string{"a/b"}}, // no depth: one level
		{"a", 2, []string{"a/b", "a/b/f.txt"}},
		{"~", 1, []string{"a", "link"}},
		{"~", 9, []string{"a", "a/b", "a/b/f.txt", "link"}},
		{"a/b", 1, []string{"a/b/f.txt"}},
	} {
		var want []string
		for _, p := range tc.want {
			want = append(want, filepath.Join(home, p))
		}
		if got := paths(filesystemtest.ListDir(t, url, tc.path, tc.depth)); !slices.Equal(got, want) {
			t.Errorf("ListDir %s depth %d: %v, want %v", tc.path, tc.depth, got, want)
		}
	}
	os.Mkdir(filepath.Join(home, "empty"), 0o755)
	if es := filesystemtest.ListDir(t, url, "empty", 1); es == nil || len(es) != 0 {
		t.Errorf("ListDir of an empty directory: %v, want an empty list", es)
	}
	rpctest.WantError(t, url, "filesystem.Filesystem/ListDir", map[string]any{"path": "a/b/f.txt"}, "invalid_argument", 400)
	rpctest.WantError(t, url, "filesystem.Filesystem/ListDir", map[string]any{"path": "nope"}, "not_found", 404)
}

// TestListDirBounds: an answer stops at its bound, and a call that was
// given up stops walking.
func TestListDirBounds(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"1", "2", "3"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o644)
	}
	req := &agentproto.ListDirRequest{Depth: 1}
	if resp, err := listDir(t.Context(), dir, req, 3); err != nil || len(resp.Entries) != 3 {
		t.Errorf("3 entries, bound 3: %v, %v", resp, err)
	}
	var e *agentproto.Error
	if _, err := listDir(t.Context(), dir, req, 2); !errors.As(err, &e) || e.Code != agentproto.CodeResourceExhausted {
		t.Errorf("3 entries, bound 2: %v, want resource_exhausted", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := listDir(ctx, dir, req, 3); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled call: %v, want it to stop", err)
	}
}
