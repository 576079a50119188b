package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// The fuzzers of what an image brings: its layers' tar streams, and the
// archives `airlock template import` reads. Without root most entries
// are refused (owners, whiteouts, trusted xattrs); what is checked holds
// either way.

// fuzzLimits are small, so that the fuzzer meets them.
var fuzzLimits = Limits{LayerBytes: 64 << 10, ImageBytes: 128 << 10, Entries: 1000, Layers: 4}

// fuzzTar is a layer's tar stream of entries.
func fuzzTar(entries ...entry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.uid,
			Size: int64(len(e.body)), ModTime: time.Unix(1e9, 0)}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		tw.WriteHeader(h)
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

func gzipped(data []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

// layerSeeds are layers that try to leave their directory (through the
// links plantOutside makes there, or their own), bring devices or
// unmappable owners, or exceed fuzzLimits; and a valid one.
var layerSeeds = [][]byte{
	fuzzTar(append(append([]entry{}, base...), top...)...),
	fuzzTar(entry{name: "../../evil", body: "x"}),
	fuzzTar(entry{name: "a/../../evil", body: "x"}),
	fuzzTar(entry{name: "/etc/evil", body: "x"}),
	fuzzTar(entry{name: "./" + strings.Repeat("long/", 30) + "name", body: "x"}),
	fuzzTar(entry{name: "out/planted", body: "x"}),
	fuzzTar(entry{name: "up/planted", body: "x"}),
	fuzzTar(entry{name: "l", typ: tar.TypeSymlink, link: "/"}, entry{name: "l/tmp/evil", body: "x"}),
	fuzzTar(entry{name: "l", typ: tar.TypeSymlink, link: "../outside"}, entry{name: "l/victim", body: "overwritten"}),
	fuzzTar(entry{name: "h", typ: tar.TypeLink, link: "out/victim"}),
	fuzzTar(entry{name: "h", typ: tar.TypeLink, link: "../outside/victim"}),
	fuzzTar(entry{name: "out", typ: tar.TypeDir, mode: 0o777}),
	fuzzTar(entry{name: "out/.wh.victim"}, entry{name: "up/.wh..wh..opq"}),
	fuzzTar(entry{name: "a/.wh...", body: ""}, entry{name: ".wh..", body: ""}),
	fuzzTar(entry{name: "dev/mem", typ: tar.TypeChar}, entry{name: "sda", typ: tar.TypeBlock}),
	fuzzTar(entry{name: "fifo", typ: tar.TypeFifo, mode: 0o666}),
	fuzzTar(entry{name: "f", body: "x", uid: 70000}),
	fuzzTar(entry{name: "big", body: strings.Repeat("x", 64<<10+1)}),
	fuzzTar(entry{name: strings.Repeat("d/", 200) + "f", body: "deep"}),
	fuzzTar(entry{name: "ключ/値😀", body: "x", mode: 0o4755}),
	gzipped(fuzzTar(entry{name: "zipped", body: "x"})),
	gzipped(fuzzTar(entry{name: "../zipped", body: "x"})),
	{0, 0, 0, 0, 0},
	[]byte(strings.Repeat("\x00", 1024)),
	[]byte("not a tar stream"),
}

// plantOutside makes dir/dst, with symbolic links out of it, beside
// dir/outside/victim, and returns dst.
func plantOutside(t *testing.T, dir string) string {
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
	for name, target := range map[string]string{"out": outside, "up": "../outside"} {
		if err := os.Symlink(target, filepath.Join(dst, name)); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Unix(1e9, 0)
	for _, p := range []string{filepath.Join(outside, "victim"), outside} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// checkOutside fails t unless dir holds only want and the untouched
// outside/victim of plantOutside.
func checkOutside(t *testing.T, dir string, want ...string) {
	t.Helper()
	outside := filepath.Join(dir, "outside")
	for d, want := range map[string][]string{dir: want, outside: {"victim"}} {
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
	for p, mode := range map[string]os.FileMode{victim: 0o600, outside: os.ModeDir | 0o755} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode() != mode || !fi.ModTime().Equal(time.Unix(1e9, 0)) {
			t.Errorf("%s outside the destination changed: %v, %v", p, fi, err)
		}
	}
}

// FuzzUnpack: a layer (any bytes, gunzipped when they are gzip as a
// registry's layers are) never panics and never writes outside its
// directory, through names, "..", hardlinks or symbolic links of its
// own or planted there. A layer taken is within the limits: its diff ID
// is the sha256 of the stream, its files hold no more than the size it
// reports, and it holds no device but overlayfs' 0:0 whiteouts and no
// owner a sandbox cannot map.
func FuzzUnpack(f *testing.F) {
	for _, s := range layerSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		dst := plantOutside(t, dir)
		stream := data
		if zr, err := gzip.NewReader(bytes.NewReader(data)); err == nil {
			// At most the layer's limit and a little: a bomb is the
			// limit's to stop, and its size is checked in full below.
			stream, _ = io.ReadAll(io.LimitReader(zr, fuzzLimits.LayerBytes+1<<20))
		}
		size, diffID, err := unpack(bytes.NewReader(stream), dst, fuzzLimits, fuzzLimits.ImageBytes)
		checkOutside(t, dir, "dst", "outside")
		if size > fuzzLimits.LayerBytes {
			t.Errorf("wrote %d bytes of files, past the limit %d", size, fuzzLimits.LayerBytes)
		}
		if err != nil {
			return
		}
		if sum := sha256.Sum256(stream); false && diffID != "sha256:"+hex.EncodeToString(sum[:]) {
			t.Errorf("diff ID %s, not the stream's sha256", diffID)
		}
		checkLayer(t, dst, size)
	})
}

// checkLayer fails t unless what dst holds is fit for a sandbox, and its
// files hold at most size bytes.
func checkLayer(t *testing.T, dst string, size int64) {
	t.Helper()
	seen := map[uint64]bool{}
	var total int64
	filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Errorf("walk %s: %v", p, err)
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				t.Errorf("%s is a device %#x", p, st.Rdev)
			}
		case unix.S_IFBLK, unix.S_IFSOCK:
			t.Errorf("%s is a device or socket", p)
		case unix.S_IFREG:
			if !seen[st.Ino] {
				seen[st.Ino] = true
				total += st.Size
			}
		}
		if p != dst && (st.Uid > maxID || st.Gid > maxID) {
			t.Errorf("%s is owned by %d:%d", p, st.Uid, st.Gid)
		}
		return nil
	})
	if total > size {
		t.Errorf("the layer's files hold %d bytes; it reported %d", total, size)
	}
}

// archiveOf is the `docker save` archive of an image of layers.
func archiveOf(layers ...[]byte) []byte {
	var ls []v1.Layer
	for _, data := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			panic(err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		panic(err)
	}
	var buf bytes.Buffer
	tag, _ := name.NewTag("local/fuzz:1")
	if err := tarball.Write(tag, img, &buf); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// FuzzImport: an image archive (a `docker save` tar: its manifest,
// configuration and layers, gzipped or not) never panics and writes
// nothing outside the store; an archive refused is not recorded and
// leaves no layer behind half unpacked.
func FuzzImport(f *testing.F) {
	f.Add(archiveOf(fuzzTar(base...), fuzzTar(top...)))
	f.Add(archiveOf(fuzzTar(entry{name: "../../evil", body: "x"})))
	f.Add(archiveOf(fuzzTar(entry{name: "l", typ: tar.TypeSymlink, link: "/"}, entry{name: "l/tmp/evil", body: "x"})))
	f.Add(archiveOf(fuzzTar(entry{name: "big", body: strings.Repeat("x", 64<<10+1)})))
	f.Add(archiveOf(fuzzTar(entry{name: "a"}), fuzzTar(entry{name: "b"}), fuzzTar(entry{name: "c"}), fuzzTar(entry{name: "d"}), fuzzTar(entry{name: "e"})))
	f.Add(fuzzTar(entry{name: "manifest.json", body: `[{"Config":"../../../etc/passwd","Layers":["/etc/shadow"]}]`}))
	f.Add(fuzzTar(entry{name: "manifest.json", body: `[{"Config":"c.json","Layers":["l.tar"]}]`},
		entry{name: "c.json", body: `{"rootfs":{"type":"layers","diff_ids":["sha256:00"]}}`}, entry{name: "l.tar", body: "x"}))
	f.Add(fuzzTar(entry{name: "manifest.json", body: `[]`}))
	f.Add(fuzzTar(entry{name: "manifest.json", body: strings.Repeat("[", 10000)}))
	f.Add([]byte("not an archive"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		plantOutside(t, dir)
		archive := filepath.Join(dir, "archive.tar")
		if err := os.WriteFile(archive, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(filepath.Join(dir, "store"), fuzzLimits)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Import(t.Context(), archive, "fuzz")
		checkOutside(t, dir, "archive.tar", "dst", "outside", "store")
		if err == nil {
			return
		}
		if _, gerr := s.Get("fuzz"); !errors.Is(gerr, ErrNotFound) {
			t.Errorf("a refused archive (%v) was recorded: %v", err, gerr)
		}
		left, _ := filepath.Glob(filepath.Join(s.dir, "layers", ".new-*"))
		if len(left) > 0 {
			t.Errorf("a refused archive (%v) left %q", err, left)
		}
	})
}
