package gvisor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/backend"
)

// A stamp accepts the state it was written for and refuses, as a
// StateError naming why, state that is unstamped, of another format,
// saved by another runsc, or changed since.
func TestStamp(t *testing.T) {
	tmp := t.TempDir()
	runsc := func(name, content string) *Backend {
		path := filepath.Join(tmp, name)
		if err := os.WriteFile(path, []byte(content), 0o700); err != nil {
			t.Fatal(err)
		}
		return &Backend{runsc: path}
	}
	be, other := runsc("runsc", "one build"), runsc("runsc-other", "another build")
	saved := func(t *testing.T) string {
		dir := t.TempDir()
		for name, content := range map[string]string{"checkpoint.img": "pages", "pages-meta.img": "meta"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := be.writeStamp(dir); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	write := func(t *testing.T, path, content string) {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	if err := be.checkStamp(saved(t)); err != nil {
		t.Fatalf("its own state refused: %v", err)
	}
	for _, c := range []struct {
		name, reason string
		change       func(t *testing.T, dir string)
		by           *Backend
	}{
		{"unstamped", "no stamp", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, stampFile)) }, be},
		{"another format", "format", func(t *testing.T, dir string) {
			data, _ := os.ReadFile(filepath.Join(dir, stampFile))
			write(t, filepath.Join(dir, stampFile), strings.Replace(string(data), stampFormat, "airlock gvisor state 9", 1))
		}, be},
		{"another runsc", "another build of runsc", func(*testing.T, string) {}, other},
		{"truncated", "corrupt", func(t *testing.T, dir string) { write(t, filepath.Join(dir, "checkpoint.img"), "pag") }, be},
		{"a file missing", "corrupt", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "pages-meta.img")) }, be},
		{"a file added", "corrupt", func(t *testing.T, dir string) { write(t, filepath.Join(dir, "extra.img"), "x") }, be},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := saved(t)
			c.change(t, dir)
			err := c.by.checkStamp(dir)
			var se *backend.StateError
			if !errors.As(err, &se) || !strings.Contains(se.Reason, c.reason) {
				t.Fatalf("got %v, want a StateError naming %q", err, c.reason)
			}
		})
	}

	// A directory among the files is not state runsc wrote: nothing is
	// stamped, or accepted, with it.
	dir := saved(t)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := be.writeStamp(dir); err == nil {
		t.Error("stamped a directory holding a directory")
	}
	if err := be.checkStamp(dir); err == nil {
		t.Error("accepted a directory holding a directory")
	}
}
