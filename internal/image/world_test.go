package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/internal/image/imagetest"
)

// worldTree is a small root with what layers hold: directories, files,
// a symlink, a file of another owner, and a file larger than one of GNU
// tar's records.
func worldTree(t *testing.T, marker string) string {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	err := imagetest.WriteTree(dir, []imagetest.Entry{
		{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/os-release", Body: "ID=world\n"},
		{Name: "usr/bin/tool", Body: "#!/bin/sh\necho tool\n", Mode: 0o755},
		{Name: "bin", Type: tar.TypeSymlink, Link: "usr/bin"},
		{Name: "srv/data", Body: strings.Repeat("data ", 3000), UID: 33},
		{Name: "srv/made-by", Body: marker},
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// worldLayer is the tree with marker as w writes it, gzip or not, and
// the diff ID of its whole uncompressed stream.
func worldLayer(t *testing.T, w imagetest.Writer, gz bool, marker string) ([]byte, v1.Hash) {
	t.Helper()
	blob, err := imagetest.Tar(w, worldTree(t, marker), gz)
	if err != nil {
		t.Fatal(err)
	}
	diffID, err := imagetest.DiffID(blob)
	if err != nil {
		t.Fatal(err)
	}
	return blob, diffID
}

// compressed is data gzipped if gz.
func compressed(data []byte, gz bool) []byte {
	if !gz {
		return data
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

// worldImage is an image of kind k with blob as its layer, whose diff ID
// its configuration gives as diffID.
func worldImage(t *testing.T, k imagetest.Kind, gz bool, blob []byte, diffID v1.Hash) v1.Image {
	t.Helper()
	l, err := imagetest.BlobLayer(blob, diffID, k.LayerType(gz))
	if err != nil {
		t.Fatal(err)
	}
	img, err := imagetest.Image(k, []string{"PATH=/bin"}, "/srv", l)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// source is a way into the store: a pull from a registry on loopback, or
// an import of an archive.
type source struct {
	name  string
	store func(t *testing.T, s *Store, k imagetest.Kind, img v1.Image, as string) (*Image, error)
}

func sources(t *testing.T, reg *httptest.Server) []source {
	host := strings.TrimPrefix(reg.URL, "http://")
	return []source{
		{"pull", func(t *testing.T, s *Store, _ imagetest.Kind, img v1.Image, as string) (*Image, error) {
			ref := host + "/world/" + as + ":1"
			tag, _ := name.ParseReference(ref)
			if err := remote.Write(tag, img); err != nil {
				t.Fatal(err)
			}
			return s.Pull(t.Context(), ref, as, nil)
		}},
		{"docker-save", func(t *testing.T, s *Store, k imagetest.Kind, img v1.Image, as string) (*Image, error) {
			archive := filepath.Join(t.TempDir(), "save.tar")
			if err := imagetest.WriteDockerSave(archive, img, "world/"+as+":1", k); err != nil {
				t.Fatal(err)
			}
			return s.Import(t.Context(), archive, as)
		}},
		{"oci-layout", func(t *testing.T, s *Store, _ imagetest.Kind, img v1.Image, as string) (*Image, error) {
			dir := filepath.Join(t.TempDir(), "oci")
			if err := imagetest.WriteLayout(dir, img); err != nil {
				t.Fatal(err)
			}
			return s.Import(t.Context(), dir, as)
		}},
	}
}

func quietRegistry(h http.Handler) *httptest.Server {
	if h == nil {
		h = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	}
	return httptest.NewServer(h)
}

// Layers as GNU tar and Python's tarfile write them, padded to records of
// 10,240 bytes, and as Go's archive/tar does, gzip and not, with OCI's
// and Docker's media types, pulled and imported: each is stored, with
// the diff ID of its whole uncompressed stream, padding included.
func TestLayersAsTheWorldWritesThem(t *testing.T) {
	s := openStore(t)
	if _, err := os.Stat(imagetest.Python3); err != nil {
		t.Skip("no " + imagetest.Python3)
	}
	reg := quietRegistry(nil)
	defer reg.Close()
	for _, src := range sources(t, reg) {
		for _, w := range imagetest.Writers {
			for _, gz := range []bool{true, false} {
				for _, k := range imagetest.Kinds {
					label := fmt.Sprintf("%s %s gzip=%v %s", src.name, w, gz, k)
					t.Run(label, func(t *testing.T) {
						// Each its own content, so that none finds its layer
						// in the store already.
						blob, diffID := worldLayer(t, w, gz, label)
						pad := imagetest.Padding(t, imagetest.Uncompressed(t, blob))
						if w != imagetest.Go && pad == 0 {
							t.Fatalf("%s wrote no padding: the test tests nothing", w)
						}
						rec, err := src.store(t, s, k, worldImage(t, k, gz, blob, diffID), "world")
						if err != nil {
							t.Fatalf("refused (%d bytes after the archive's end): %v", pad, err)
						}
						if len(rec.Layers) != 1 || rec.Layers[0] != diffID.String() {
							t.Fatalf("diff IDs %v, want [%s] (the whole stream's)", rec.Layers, diffID)
						}
						dirs, err := s.LayerDirs(rec)
						if err != nil {
							t.Fatal(err)
						}
						if got, _ := os.ReadFile(filepath.Join(dirs[0], "srv/made-by")); string(got) != label {
							t.Errorf("srv/made-by: %q, want %q", got, label)
						}
						if fi, err := os.Stat(filepath.Join(dirs[0], "srv/data")); err != nil || fi.Size() != 15000 {
							t.Errorf("srv/data: %v %v", fi, err)
						}
					})
				}
			}
		}
	}
}

// worldRefusal is what a refused layer gets: one line saying the layer
// is not the one its digest names.
var worldRefusal = regexp.MustCompile(`^layer 1 of 1: the layer( is cut short|'s content does not match its digest sha256:[0-9a-f]{64}$| is longer than)`)

func checkRefused(t *testing.T, s *Store, err error) {
	t.Helper()
	t.Logf("the store: %v", err)
	// One test's failure is not the next's: what it recorded goes.
	t.Cleanup(func() { s.Remove("altered"); s.Prune() })
	var ue *UnpackError
	if !errors.As(err, &ue) || strings.Contains(err.Error(), "\n") || !worldRefusal.MatchString(err.Error()) {
		t.Fatalf("got %v, want a one-line refusal (%s)", err, worldRefusal)
	}
	if _, err := s.Get("altered"); !errors.Is(err, ErrNotFound) {
		t.Error("the refused image was recorded")
	}
	if left, _ := os.ReadDir(filepath.Join(s.dir, "layers")); len(left) != 0 {
		t.Errorf("left in the store: %v", left)
	}
}

// alterations of a layer's uncompressed stream.
var alterations = []struct {
	name  string
	alter func([]byte) []byte
}{
	{"a byte of its padding flipped", func(b []byte) []byte {
		b = bytes.Clone(b)
		b[len(b)-100] ^= 1
		return b
	}},
	{"cut short in its padding", func(b []byte) []byte { return b[:len(b)-512] }},
	{"cut short in its entries", func(b []byte) []byte { return b[:len(b)/2] }},
}

// A layer whose stream is not the one its diff ID names, by a byte of its
// padding or by what was cut off its end, is refused, pulled or imported:
// the configuration's diff ID names the whole stream.
func TestRefusesAlteredStreams(t *testing.T) {
	s := openStore(t)
	reg := quietRegistry(nil)
	defer reg.Close()
	for _, src := range sources(t, reg) {
		for _, w := range []imagetest.Writer{imagetest.GNUTar, imagetest.Python} {
			for _, gz := range []bool{true, false} {
				for _, a := range alterations {
					t.Run(fmt.Sprintf("%s %s gzip=%v %s", src.name, w, gz, a.name), func(t *testing.T) {
						blob, diffID := worldLayer(t, w, gz, a.name)
						altered := compressed(a.alter(imagetest.Uncompressed(t, blob)), gz)
						// The blob is consistent with its digest: only the diff
						// ID tells.
						_, err := src.store(t, s, imagetest.OCI, worldImage(t, imagetest.OCI, gz, altered, diffID), "altered")
						checkRefused(t, s, err)
					})
				}
			}
		}
	}
}

// A blob that is not the one its digest names is refused, whether its
// uncompressed stream still matches the diff ID or not: served so by a
// registry, or so in an OCI layout.
func TestRefusesAlteredBlobs(t *testing.T) {
	s := openStore(t)
	blobAlterations := append(alterations[:len(alterations):len(alterations)], struct {
		name  string
		alter func([]byte) []byte
	}{"gzip's header changed (its stream unchanged)", nil})
	for _, gz := range []bool{true, false} {
		for _, a := range blobAlterations {
			if a.alter == nil && !gz {
				continue
			}
			blob, diffID := worldLayer(t, imagetest.GNUTar, gz, a.name)
			var altered []byte
			if a.alter != nil {
				altered = compressed(a.alter(imagetest.Uncompressed(t, blob)), gz)
			} else {
				altered = bytes.Clone(blob)
				altered[4] ^= 1 // MTIME, which gunzip does not check
			}
			img := worldImage(t, imagetest.OCI, gz, blob, diffID)
			served := altered[:min(len(altered), len(blob))]
			want, _ := img.Layers()
			digest, _ := want[0].Digest()
			t.Run(fmt.Sprintf("registry gzip=%v %s", gz, a.name), func(t *testing.T) {
				// A registry that serves other bytes for the layer's digest.
				inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
				lying := quietRegistry(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+digest.String()) {
						// The length the manifest gives: a shorter body is a
						// connection cut short.
						w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
						w.Header().Set("Docker-Content-Digest", digest.String())
						w.Write(served)
						return
					}
					inner.ServeHTTP(w, r)
				}))
				defer lying.Close()
				ref := strings.TrimPrefix(lying.URL, "http://") + "/world/altered:1"
				tag, _ := name.ParseReference(ref)
				if err := remote.Write(tag, img); err != nil {
					t.Fatal(err)
				}
				_, err := s.Pull(t.Context(), ref, "altered", nil)
				checkRefused(t, s, err)
			})
			t.Run(fmt.Sprintf("oci-layout gzip=%v %s", gz, a.name), func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "oci")
				if err := imagetest.WriteLayout(dir, img); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "blobs/sha256", digest.Hex), altered, 0o644); err != nil {
					t.Fatal(err)
				}
				_, err := s.Import(t.Context(), dir, "altered")
				checkRefused(t, s, err)
			})
		}
	}
}

// What follows a layer's archive counts against its limit, as file
// contents do: a stream of padding without end costs no more than a file
// of its size.
func TestPaddingCountsAgainstTheLimit(t *testing.T) {
	s := openStore(t)
	small := *s
	small.limits.LayerBytes = 64 << 10
	blob, _ := worldLayer(t, imagetest.Go, false, "padded")
	blob = append(blob, make([]byte, 1<<20)...)
	diffID, _ := imagetest.DiffID(blob)
	_, err := small.Put(context.Background(), "altered", "test", worldImage(t, imagetest.OCI, false, blob, diffID))
	var ue *UnpackError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "more than its limit") {
		t.Fatalf("1 MiB of padding under a 64 KiB limit: got %v", err)
	}
	// Within the limit, it is the layer's, and its diff ID covers it.
	rec, err := s.Put(context.Background(), "padded", "test", worldImage(t, imagetest.OCI, false, blob, diffID))
	if err != nil || rec.Layers[0] != diffID.String() {
		t.Fatalf("1 MiB of padding: %v %v, want %s", rec, err, diffID)
	}
}
