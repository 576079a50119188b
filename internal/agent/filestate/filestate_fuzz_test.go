package filestate

import (
	"archive/tar"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fuzzEntry is one entry of a fuzz seed's tar stream.
type fuzzEntry struct {
	name, link, body string
	typ              byte
}

// tarOf is the tar stream of entries, owned by this process's user (so
// that an unprivileged agent may give them their owners).
func tarOf(entries ...fuzzEntry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o755, Size: int64(len(e.body)),
			Uid: os.Getuid(), Gid: os.Getgid(), ModTime: time.Unix(1e9, 0)}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		tw.WriteHeader(h)
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

// untarSeeds are tar streams that try to leave the destination, through
// the links planted there (plantEscapes) or their own.
var untarSeeds = [][]byte{
	tarOf(fuzzEntry{name: "a/", typ: tar.TypeDir}, fuzzEntry{name: "a/f", body: "x", typ: tar.TypeReg},
		fuzzEntry{name: "a/l", link: "f", typ: tar.TypeSymlink}),
	tarOf(fuzzEntry{name: ".", typ: tar.TypeDir}, fuzzEntry{name: "./f", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "../evil", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "a/../../evil", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "/abs/evil", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "out/evil", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "up/evil", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "out/victim", body: "overwritten", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "out", typ: tar.TypeDir}),
	tarOf(fuzzEntry{name: "dotdot", typ: tar.TypeDir}),
	tarOf(fuzzEntry{name: "dotdot/outside/victim", body: "overwritten", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "slash/tmp/evil", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "l", link: "/", typ: tar.TypeSymlink}, fuzzEntry{name: "l/tmp/evil", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "l", link: "../outside", typ: tar.TypeSymlink}, fuzzEntry{name: "l/evil", typ: tar.TypeDir}),
	tarOf(fuzzEntry{name: "h", link: "out/victim", typ: tar.TypeLink}, fuzzEntry{name: "h", body: "x", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: strings.Repeat("d/", 300) + "f", body: "deep", typ: tar.TypeReg}),
	tarOf(fuzzEntry{name: "ключ/値😀", body: "x", typ: tar.TypeReg}),
	{0, 0, 0, 0, 0},
	[]byte(strings.Repeat("\x00", 1024)),
	[]byte("not a tar stream"),
}

// plantEscapes makes dir/dst with symbolic links out of it, beside
// dir/outside/victim, and returns dst.
func plantEscapes(t *testing.T, dir string) string {
	t.Helper()
	dst, outside := filepath.Join(dir, "dst"), filepath.Join(dir, "outside")
	for _, d := range []string{dst, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("host file"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"out": outside, "up": "../outside", "dotdot": "..", "slash": "/"} {
		if err := os.Symlink(target, filepath.Join(dst, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Times and modes to compare with afterwards.
	old := time.Unix(1e9, 0)
	for _, p := range []string{filepath.Join(outside, "victim"), outside, dir} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// checkNoEscape fails t unless dir holds what plantEscapes made there,
// unchanged, and nothing else beside dst.
func checkNoEscape(t *testing.T, dir string) {
	t.Helper()
	outside := filepath.Join(dir, "outside")
	for d, want := range map[string][]string{dir: {"dst", "outside"}, outside: {"victim"}} {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, want) {
			t.Errorf("%s holds %q, want %q: something was written outside the destination", d, names, want)
		}
	}
	victim := filepath.Join(outside, "victim")
	if data, err := os.ReadFile(victim); err != nil || string(data) != "host file" {
		t.Errorf("the file outside the destination changed: %q, %v", data, err)
	}
	old := time.Unix(1e9, 0)
	for p, mode := range map[string]os.FileMode{victim: 0o600, outside: os.ModeDir | 0o755} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode || !fi.ModTime().Equal(old) {
			t.Errorf("%s outside the destination changed: mode %v, time %v", p, fi.Mode(), fi.ModTime())
		}
	}
}

// FuzzUntar: the untar stream of a build's COPY (any bytes) never
// panics, and nothing it holds, through names, ".." or symbolic links
// of its own or planted in the destination, lands outside it or changes
// a file there.
func FuzzUntar(f *testing.F) {
	for _, s := range untarSeeds {
		f.Add(s, false)
	}
	f.Add(untarSeeds[1], true)
	f.Fuzz(func(t *testing.T, data []byte, keepDir bool) {
		dir := t.TempDir()
		root, err := os.OpenRoot(plantEscapes(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		untarInto(root, tar.NewReader(bytes.NewReader(data)), keepDir)
		checkNoEscape(t, dir)
	})
}

// FuzzFileStateEntry: an entry of a saved file state lands in the saved
// directory its name is under, as a local name there, or nowhere.
func FuzzFileStateEntry(f *testing.F) {
	for _, n := range []string{
		"home/user", "home/user/", "home/user/a/b", "tmp/x", "/tmp/x", "home/user/../../etc", "home/userx", "home",
		"../tmp/x", "tmp/../home/user/.ssh", "tmp/./x//y/", "tmp\x00/x", "./tmp/x", "", ".", "..", "tmp/ключ",
	} {
		f.Add(n)
	}
	roots := map[string]*os.Root{}
	for _, d := range dirs {
		roots[d] = &os.Root{}
	}
	f.Fuzz(func(t *testing.T, name string) {
		root, rel, ok := entryRoot(roots, name)
		clean := path.Clean(name)
		var under string
		for d, r := range roots {
			if clean == d || strings.HasPrefix(clean, d+"/") {
				under = d
				if ok && r != root {
					t.Errorf("%q went to the root of another directory than %s", name, d)
				}
			}
		}
		switch {
		case ok != (under != ""):
			t.Errorf("%q: taken %v, under a saved directory %q", name, ok, under)
		case ok && rel != "." && !filepath.IsLocal(rel):
			t.Errorf("%q: name %q in %s is not local", name, rel, under)
		case ok && path.Join(under, rel) != clean:
			t.Errorf("%q: name %q in %s is another file", name, rel, under)
		}
	})
}
