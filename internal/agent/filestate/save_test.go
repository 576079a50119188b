package filestate

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// entries reads a tar stream as name → content, or "->target" for a
// link, "dir" for a directory.
func entries(t *testing.T, data []byte) map[string]string {
	t.Helper()
	got := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			got[hdr.Name] = "dir"
		case tar.TypeSymlink:
			got[hdr.Name] = "->" + hdr.Linkname
		default:
			body, _ := io.ReadAll(tr)
			got[hdr.Name] = string(body)
		}
		if hdr.Uname != "" || hdr.Gname != "" {
			t.Errorf("%s carries names %q %q", hdr.Name, hdr.Uname, hdr.Gname)
		}
	}
}

// TestSave: the saved directories' directories, files and links, named
// relative to "/"; what is neither is left out.
func TestSave(t *testing.T) {
	c, base := newService(t, false)
	write(t, filepath.Join(base, "home/user"), map[string]string{"a.txt": "a", "sub/": "", "sub/b": "b", "link": "->a.txt"})
	write(t, filepath.Join(base, "tmp"), map[string]string{"t": "t"})
	write(t, base, map[string]string{"etc/secret": "not saved"})
	if err := syscall.Mkfifo(filepath.Join(base, "tmp/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := c.SaveFiles(t.Context(), &out, 1<<20); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"home/user": "dir", "home/user/a.txt": "a", "home/user/sub": "dir", "home/user/sub/b": "b", "home/user/link": "->a.txt",
		"tmp": "dir", "tmp/t": "t",
	}
	if got := entries(t, out.Bytes()); !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestSaveIncomplete: a file the agent cannot read leaves the stream
// without its trailer, which the daemon takes as a save that failed.
func TestSaveIncomplete(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every file")
	}
	c, base := newService(t, false)
	write(t, filepath.Join(base, "home/user"), map[string]string{"locked/x": "x"})
	os.Chmod(filepath.Join(base, "home/user/locked"), 0)
	t.Cleanup(func() { os.Chmod(filepath.Join(base, "home/user/locked"), 0o755) })
	if err := c.SaveFiles(t.Context(), io.Discard, 1<<20); !errors.Is(err, agentproto.ErrFilesIncomplete) {
		t.Errorf("got %v, want ErrFilesIncomplete", err)
	}
}
