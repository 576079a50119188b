package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.uid, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOf(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf.Config.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	cf.Config.WorkingDir = "/srv"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

var base = []entry{
	{name: "usr/", typ: tar.TypeDir, mode: 0o755},
	{name: "usr/bin/", typ: tar.TypeDir, mode: 0o755},
	{name: "usr/bin/tool", body: "#!/bin/sh\necho tool\n", mode: 0o755},
	{name: "usr/bin/tool-again", typ: tar.TypeLink, link: "usr/bin/tool"},
	{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
	{name: "etc/", typ: tar.TypeDir, mode: 0o755},
	{name: "etc/gone", body: "deleted above"},
	{name: "etc/cache/", typ: tar.TypeDir, mode: 0o755},
	{name: "etc/cache/old", body: "hidden above"},
	{name: "srv/data", body: "owned by 33", uid: 33},
}

var top = []entry{
	{name: "etc/.wh.gone", body: ""},
	{name: "etc/cache/.wh..wh..opq", body: ""},
	{name: "etc/cache/new", body: "fresh"},
}

func openStore(t *testing.T) *Store {
	t.Helper()
	airlocktest.RequiresRoot(t) // owners, whiteouts and trusted xattrs
	s, err := Open(t.TempDir(), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPullUnpacksForOverlayfs(t *testing.T) {
	s := openStore(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/test/tool:1"
	tag, _ := name.ParseReference(ref)
	if err := remote.Write(tag, imageOf(t, layerOf(t, base...), layerOf(t, top...))); err != nil {
		t.Fatal(err)
	}
	img, err := s.Pull(t.Context(), ref, "tool", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 2 || img.Config.WorkingDir != "/srv" || img.Size == 0 {
		t.Errorf("stored %+v", img)
	}
	dirs, err := s.LayerDirs(img)
	if err != nil {
		t.Fatal(err)
	}
	upper, lower := dirs[0], dirs[1]
	check := func(p string, f func(os.FileInfo, *unix.Stat_t) bool, what string) {
		t.Helper()
		var st unix.Stat_t
		fi, err := os.Lstat(p)
		if err != nil || unix.Lstat(p, &st) != nil || !f(fi, &st) {
			t.Errorf("%s: %s (%v)", p, what, err)
		}
	}
	check(filepath.Join(lower, "usr/bin/tool"), func(fi os.FileInfo, _ *unix.Stat_t) bool { return fi.Mode().Perm() == 0o755 }, "mode 0755")
	check(filepath.Join(lower, "usr/bin/tool-again"), func(_ os.FileInfo, st *unix.Stat_t) bool { return st.Nlink == 2 }, "a hardlink")
	check(filepath.Join(lower, "bin"), func(fi os.FileInfo, _ *unix.Stat_t) bool { return fi.Mode()&os.ModeSymlink != 0 }, "a symlink")
	check(filepath.Join(lower, "srv/data"), func(_ os.FileInfo, st *unix.Stat_t) bool { return st.Uid == 33 && st.Gid == 33 }, "owned by 33")
	check(filepath.Join(upper, "etc/gone"), func(_ os.FileInfo, st *unix.Stat_t) bool {
		return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
	}, "a 0:0 character device (overlayfs' whiteout)")
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Lgetxattr(filepath.Join(upper, "etc/cache"), attr, buf); err != nil || string(buf[:n]) != "y" {
			t.Errorf("etc/cache has no %s: %v", attr, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(upper, "etc/.wh.gone")); err == nil {
		t.Error("the OCI whiteout file itself was kept")
	}

	// A second image on the same base shares its layer.
	if err := remote.Write(tag, imageOf(t, layerOf(t, base...), layerOf(t, entry{name: "other", body: "x"}))); err != nil {
		t.Fatal(err)
	}
	other, err := s.Pull(t.Context(), ref, "other", nil)
	if err != nil {
		t.Fatal(err)
	}
	if other.Layers[0] != img.Layers[0] {
		t.Error("the shared base layer was stored twice")
	}
	if list, _ := s.List(); len(list) != 2 {
		t.Errorf("list: %d images", len(list))
	}
	if err := s.Remove("tool"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(upper); err == nil {
		t.Error("a layer no image has survived the removal")
	}
	if _, err := os.Stat(lower); err != nil {
		t.Error("a layer another image has was removed")
	}
	if _, err := s.Get("tool"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after remove: %v", err)
	}
}

func TestImportArchives(t *testing.T) {
	s := openStore(t)
	img := imageOf(t, layerOf(t, base...))
	dir := t.TempDir()
	tag, _ := name.NewTag("local/tool:1")
	if err := tarball.WriteToFile(filepath.Join(dir, "save.tar"), tag, img); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{filepath.Join(dir, "save.tar"), filepath.Join(dir, "oci")} {
		got, err := s.Import(t.Context(), src, "imported")
		if err != nil {
			t.Fatalf("import %s: %v", filepath.Base(src), err)
		}
		if len(got.Layers) != 1 || got.Config.WorkingDir != "/srv" {
			t.Errorf("import %s: %+v", filepath.Base(src), got)
		}
	}
	os.WriteFile(filepath.Join(dir, "junk.tar"), []byte("not a tar"), 0o644)
	if _, err := s.Import(t.Context(), filepath.Join(dir, "junk.tar"), "junk"); err == nil || !strings.Contains(err.Error(), "not an image archive") {
		t.Errorf("a junk archive: %v", err)
	}
}

// Archives that try to escape, or to bring what a sandbox must not have,
// are refused with a message naming the entry, and leave nothing behind.
func TestRefusesHostileLayers(t *testing.T) {
	s := openStore(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("host file"), 0o600)
	small := *s
	small.limits.LayerBytes = 1000
	small.limits.Entries = 10
	for _, tc := range []struct {
		name    string
		store   *Store
		entries []entry
		want    string
	}{
		{"dot-dot", s, []entry{{name: "../../evil", body: "x"}}, "leaves the layer"},
		{"dot-dot inside", s, []entry{{name: "a/../../evil", body: "x"}}, "leaves the layer"},
		{"absolute", s, []entry{{name: "/etc/evil", body: "x"}}, "absolute"},
		{"through a symlink out", s, []entry{{name: "out", typ: tar.TypeSymlink, link: outside}, {name: "out/planted", body: "x"}}, "out/planted"},
		{"through a relative symlink out", s, []entry{{name: "up", typ: tar.TypeSymlink, link: "../../../../../../../.."}, {name: "up" + outside + "/planted", body: "x"}}, "planted"},
		{"hardlink to a host file", s, []entry{{name: "h", typ: tar.TypeLink, link: victim}}, "absolute"},
		{"hardlink out by dot-dot", s, []entry{{name: "h", typ: tar.TypeLink, link: "../../../../../.." + victim}}, "leaves the layer"},
		{"hardlink through a symlink", s, []entry{{name: "out", typ: tar.TypeSymlink, link: outside}, {name: "h", typ: tar.TypeLink, link: "out/victim"}}, "not a file of the layer"},
		{"character device", s, []entry{{name: "dev/mem", typ: tar.TypeChar}}, "device node"},
		{"block device", s, []entry{{name: "sda", typ: tar.TypeBlock}}, "device node"},
		{"unmappable owner", s, []entry{{name: "f", body: "x", uid: 70000}}, "owned by 70000"},
		{"whiteout of dot-dot", s, []entry{{name: "a/.wh...", body: ""}}, "whiteout of no name"},
		{"too big", &small, []entry{{name: "big", body: strings.Repeat("x", 2000)}}, "more than its limit"},
		{"too many entries", &small, func() []entry {
			var es []entry
			for i := range 20 {
				es = append(es, entry{name: "f" + string(rune('a'+i)), body: "x"})
			}
			return es
		}(), "more than 10 entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.store.Put(context.Background(), "hostile", "test", imageOf(t, layerOf(t, tc.entries...)))
			var ue *UnpackError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a refusal mentioning %q", err, tc.want)
			}
			if _, err := s.Get("hostile"); !errors.Is(err, ErrNotFound) {
				t.Error("a refused image was recorded")
			}
			left, _ := os.ReadDir(filepath.Join(s.dir, "layers"))
			if len(left) != 0 {
				t.Errorf("left in the store: %v", left)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 1 {
				t.Errorf("something was written outside the store: %v", entries)
			}
			if data, _ := os.ReadFile(victim); string(data) != "host file" {
				t.Error("the host file changed")
			}
		})
	}
}

// Prune leaves alone what an image being made holds (Hold), and removes
// it once nothing holds it and no image refers to it.
func TestPruneWaitsForHold(t *testing.T) {
	s := openStore(t)
	rc, err := layerOf(t, entry{name: "srv/x", body: "x"}).Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	diffID, _, err := s.AddLayer(rc, DefaultLimits.ImageBytes)
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := s.layerDir(diffID)
	release, err := s.Hold()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Prune(); err != nil || !dirExists(dir) {
		t.Fatalf("a prune while held: %v, layer there: %v", err, dirExists(dir))
	}
	release()
	if err := s.Prune(); err != nil || dirExists(dir) {
		t.Fatalf("a prune once released: %v, layer there: %v", err, dirExists(dir))
	}
}

// A store that shares another's (the stock templates') finds its images
// and layers, builds on them, and never lists, removes or prunes them.
func TestSharedStore(t *testing.T) {
	stock, own := openStore(t), openStore(t)
	img, err := stock.Put(t.Context(), "stock", "test", imageOf(t, layerOf(t, base...)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := own.Get("stock"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("before Share: got %v, want ErrNotFound", err)
	}
	own.Share(stock)
	got, err := own.Get("stock")
	if err != nil || got.Layers[0] != img.Layers[0] {
		t.Fatalf("Get of a shared image: %+v, %v", got, err)
	}
	// An image of own's own, built on the shared one's layer.
	id, _, err := own.AddLayer(bytes.NewReader(tarOf(t, top...)), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	built := &Image{Name: "built", Layers: []string{img.Layers[0], id}}
	if err := own.Save(built); err != nil {
		t.Fatal(err)
	}
	dirs, err := own.LayerDirs(built)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dirs[0], own.dir) || !strings.HasPrefix(dirs[1], stock.dir) {
		t.Errorf("layer dirs %v: want own's top layer above the shared base", dirs)
	}
	if list, _ := own.List(); len(list) != 1 || list[0].Name != "built" {
		t.Errorf("List: %v, want only own's image", list)
	}
	if err := own.Remove("stock"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove of a shared image: %v, want ErrNotFound", err)
	}
	if err := own.Remove("built"); err != nil {
		t.Fatal(err)
	}
	if _, err := stock.LayerDirs(img); err != nil {
		t.Errorf("the shared layer is gone after own's prune: %v", err)
	}
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	rc, err := layerOf(t, entries...).Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
