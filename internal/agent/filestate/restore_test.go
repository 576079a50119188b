package filestate

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Entries of a saved file state land in the saved directories only.
func TestEntryRoot(t *testing.T) {
	home, tmp := &os.Root{}, &os.Root{}
	roots := map[string]*os.Root{"home/user": home, "tmp": tmp}
	for name, want := range map[string]struct {
		root *os.Root
		rel  string
	}{
		"home/user":             {home, "."},
		"home/user/a/b.txt":     {home, "a/b.txt"},
		"tmp/x":                 {tmp, "x"},
		"/tmp/x":                {nil, ""}, // absolute: not what getFileState writes
		"home/user/../../etc":   {nil, ""},
		"home/userx/a":          {nil, ""},
		"home":                  {nil, ""},
		"../tmp/x":              {nil, ""},
		"etc/passwd":            {nil, ""},
		"tmp/../home/user/.ssh": {home, ".ssh"},
	} {
		root, rel, ok := entryRoot(roots, name)
		if ok != (want.root != nil) || root != want.root || rel != want.rel {
			t.Errorf("%q: got %v %q %v, want %q", name, root == home, rel, ok, want.rel)
		}
	}
}

// TestSaveAndRestore: what one sandbox saved, a new one of its template
// has back, in the same places, with the same modes and links.
func TestSaveAndRestore(t *testing.T) {
	from, base := newService(t, false)
	write(t, filepath.Join(base, "home/user"), map[string]string{"a.txt": "a", "sub/b": "b", "link": "->sub/b"})
	write(t, filepath.Join(base, "tmp"), map[string]string{"t": "t"})
	var saved bytes.Buffer
	if err := from.SaveFiles(t.Context(), &saved, 1<<20); err != nil {
		t.Fatal(err)
	}
	to, newBase := newService(t, false)
	write(t, filepath.Join(newBase, "home/user"), map[string]string{"a.txt": "replaced", "kept": "k"})
	if err := to.RestoreFiles(t.Context(), bytes.NewReader(saved.Bytes())); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"home/user/a.txt": "a", "home/user/sub/b": "b", "home/user/kept": "k", "tmp/t": "t"} {
		if got, err := os.ReadFile(filepath.Join(newBase, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(newBase, "home/user/a.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("a.txt's mode: %v, %v", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(newBase, "home/user/link")); err != nil || target != "sub/b" {
		t.Errorf("the link: %q, %v", target, err)
	}
}

func TestRestoreRefused(t *testing.T) {
	c, base := newService(t, false)
	for name, stream := range map[string][]byte{
		"an entry outside":  tarOf(fuzzEntry{name: "etc/passwd", body: "x", typ: tar.TypeReg}),
		"climbing out":      tarOf(fuzzEntry{name: "tmp/../../escape", body: "x", typ: tar.TypeReg}),
		"not a tar stream":  []byte(strings.Repeat("x", 1024)),
		"an absolute entry": tarOf(fuzzEntry{name: "/tmp/x", body: "x", typ: tar.TypeReg}),
	} {
		var e *agentproto.Error
		if err := c.RestoreFiles(t.Context(), bytes.NewReader(stream)); !errors.As(err, &e) || e.Message == "" {
			t.Errorf("%s: %v, want the agent's refusal", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(base, "..", "escape")); !os.IsNotExist(err) {
		t.Errorf("an entry landed outside: %v", err)
	}
}
