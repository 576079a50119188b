package build

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
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

// TestPutContext: a COPY's source from a build context is stored as the
// SDK uploads it: paths relative to the context, owners cleared,
// symlinks as symlinks; the same content gives the same hash; sources
// outside the context, missing or too large are refused.
func TestPutContext(t *testing.T) {
	ctx := t.TempDir()
	os.MkdirAll(filepath.Join(ctx, "app/lib"), 0o755)
	os.WriteFile(filepath.Join(ctx, "app/main.py"), []byte("print(1)"), 0o644)
	os.WriteFile(filepath.Join(ctx, "app/lib/x.py"), []byte("x = 1"), 0o600)
	os.Symlink("/etc/passwd", filepath.Join(ctx, "app/link"))
	os.WriteFile(filepath.Join(ctx, "a.txt"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(ctx, "b.txt"), []byte("bb"), 0o644)
	syscall.Mkfifo(filepath.Join(ctx, "app/fifo"), 0o644)
	files, err := OpenFiles(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	read := func(hash string) []string {
		t.Helper()
		r, err := files.open(hash)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var got []string
		tr := tar.NewReader(r)
		for {
			hdr, err := tr.Next()
			if err != nil {
				break
			}
			body, _ := io.ReadAll(tr)
			got = append(got, fmt.Sprintf("%s %o %d:%d %s%s", hdr.Name, hdr.Mode, hdr.Uid, hdr.Gid, body, hdr.Linkname))
		}
		return got
	}
	hash, err := files.PutContext(ctx, "./app")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"app/ 755 0:0 ", "app/lib/ 755 0:0 ", "app/lib/x.py 600 0:0 x = 1", "app/link 777 0:0 /etc/passwd", "app/main.py 644 0:0 print(1)"}
	if got := read(hash); !slices.Equal(got, want) {
		t.Errorf("the upload of app: %q, want %q", got, want)
	}
	if !files.Has(hash) {
		t.Error("Has is false for the upload")
	}
	if again, err := files.PutContext(ctx, "app"); err != nil || again != hash {
		t.Errorf("the same source again: %s %v, want %s", again, err, hash)
	}
	glob, err := files.PutContext(ctx, "*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := read(glob); !slices.Equal(got, []string{"a.txt 644 0:0 a", "b.txt 644 0:0 bb"}) {
		t.Errorf("the upload of *.txt: %q", got)
	}
	for src, want := range map[string]string{
		"../x":    "COPY ../x: the source must be inside the build context",
		"/etc":    "COPY /etc: the source must be inside the build context",
		"missing": "COPY missing: nothing of that name in the build context",
	} {
		if _, err := files.PutContext(ctx, src); err == nil || err.Error() != want {
			t.Errorf("PutContext(%q): %v, want %q", src, err, want)
		}
	}
	small, _ := OpenFiles(t.TempDir(), 5)
	if _, err := small.PutContext(ctx, "app"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("past the limit: %v", err)
	}
}
