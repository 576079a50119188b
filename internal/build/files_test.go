package build

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A file of a build context swapped for a FIFO or another file between
// the walk that listed it and its open is refused, never waited on.
func TestOpenListedRefusesSwaps(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "f")
	if err := os.WriteFile(name, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	listed, err := os.Lstat(name)
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	f, err := openListed(root, "f", listed)
	if err != nil {
		t.Fatalf("the listed file itself: %v", err)
	}
	f.Close()
	for _, c := range []struct {
		name string
		swap func() error
	}{
		// Made while the listed file still exists, so not of its inode.
		{"another file", func() error {
			if err := os.WriteFile(name+".new", []byte("other"), 0o644); err != nil {
				return err
			}
			return os.Rename(name+".new", name)
		}},
		{"a FIFO", func() error { return syscall.Mkfifo(name, 0o644) }},
		{"a directory", func() error { return os.Mkdir(name, 0o755) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name != "another file" {
				os.Remove(name)
			}
			if err := c.swap(); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(name)
			if f, err := openListed(root, "f", listed); err == nil || !strings.Contains(err.Error(), "changed while it was read") {
				if f != nil {
					f.Close()
				}
				t.Errorf("openListed = %v, want a refusal", err)
			}
		})
	}
}
