package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/image/imagetest"
)

// worldImages makes images as the world writes them: busybox's root in
// one layer, written by GNU tar, Python's tarfile or Go's archive/tar,
// gzip or not, with OCI's or Docker's media types. Each has its own
// content (srv/made-by holds its name), so that no two share a layer.
type worldImage struct {
	name   string
	kind   imagetest.Kind
	img    v1.Image
	diffID v1.Hash // sha256 of its layer's whole uncompressed stream
}

func worldImages(t *testing.T, prefix string) []worldImage {
	t.Helper()
	for _, p := range []string{imagetest.Busybox, imagetest.Python3} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("no %s (make test installs it)", p)
		}
	}
	root := t.TempDir()
	if err := imagetest.BusyboxTree(root); err != nil {
		t.Fatal(err)
	}
	var out []worldImage
	for _, w := range imagetest.Writers {
		for _, gz := range []bool{true, false} {
			for _, k := range imagetest.Kinds {
				n := fmt.Sprintf("%s-%s-%s-plain", prefix, w, k)
				if gz {
					n = strings.TrimSuffix(n, "-plain") + "-gzip"
				}
				if err := os.WriteFile(filepath.Join(root, "srv/made-by"), []byte(n+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				blob, err := imagetest.Tar(w, root, gz)
				if err != nil {
					t.Fatal(err)
				}
				diffID, err := imagetest.DiffID(blob)
				if err != nil {
					t.Fatal(err)
				}
				if pad := imagetest.Padding(t, imagetest.Uncompressed(t, blob)); w != imagetest.Go && pad == 0 {
					t.Fatalf("%s wrote no padding: the test tests nothing", w)
				}
				l, err := imagetest.BlobLayer(blob, diffID, k.LayerType(gz))
				if err != nil {
					t.Fatal(err)
				}
				img, err := imagetest.Image(k, []string{"PATH=/bin"}, "/srv", l)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, worldImage{n, k, img, diffID})
			}
		}
	}
	return out
}

// storedLayers are the diff IDs the store recorded for template n.
func storedLayers(t *testing.T, state, n string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(state, "images", "images", n+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ Layers []string }
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.Layers
}

func haveRunsc() bool {
	_, err := exec.LookPath("runsc")
	return err == nil || os.Getenv("AIRLOCK_RUNSC") != ""
}

// Images whose layers GNU tar and Python's tarfile wrote (padded to
// records of 10,240 bytes) and Go's archive/tar wrote (not padded), gzip
// and not, with OCI's and Docker's media types: `airlock template pull`
// from a registry on loopback and `airlock template import` of a docker
// save archive and of an OCI layout store each with the diff ID of its
// layer's whole uncompressed stream, and each runs, on namespaces and on
// gVisor.
func TestTemplatesAsTheWorldWritesThem(t *testing.T) {
	airlocktest.RequiresRoot(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	state := t.TempDir()
	gvisor := haveRunsc()
	if !gvisor {
		t.Log("no runsc (make test builds it; AIRLOCK_RUNSC names it): namespaces only")
	}
	for _, src := range []string{"pull", "save", "layout"} {
		for _, wi := range worldImages(t, src) {
			t.Run(wi.name, func(t *testing.T) {
				var r cliResult
				switch src {
				case "pull":
					// The CLI pulls as the operator, on the host's network:
					// loopback is a registry like any other.
					ref := strings.TrimPrefix(reg.URL, "http://") + "/world/" + wi.name + ":1"
					tag, _ := name.ParseReference(ref)
					if err := remote.Write(tag, wi.img); err != nil {
						t.Fatal(err)
					}
					r = airlock(t, "", "template", "pull", wi.name, ref, "--state-dir", state)
				case "save":
					archive := filepath.Join(t.TempDir(), "image.tar")
					if err := imagetest.WriteDockerSave(archive, wi.img, "world/"+wi.name+":1", wi.kind); err != nil {
						t.Fatal(err)
					}
					r = airlock(t, "", "template", "import", wi.name, archive, "--state-dir", state)
				case "layout":
					dir := filepath.Join(t.TempDir(), "oci")
					if err := imagetest.WriteLayout(dir, wi.img); err != nil {
						t.Fatal(err)
					}
					r = airlock(t, "", "template", "import", wi.name, dir, "--state-dir", state)
				}
				if r.code != 0 {
					t.Fatalf("template %s: exit %d: %s", src, r.code, r.stderr)
				}
				if got := storedLayers(t, state, wi.name); len(got) != 1 || got[0] != wi.diffID.String() {
					t.Errorf("recorded diff IDs %v, want [%s]: the whole stream's", got, wi.diffID)
				}
				backends := []string{"namespaces"}
				if gvisor {
					backends = append(backends, "gvisor")
				}
				for _, be := range backends {
					r := airlock(t, "", "run", "--backend", be, "--state-dir", state, "--template", wi.name, "--",
						"/bin/sh", "-c", "cat /srv/made-by; id -u; pwd")
					if want := wi.name + "\n1000\n/srv\n"; r.code != 0 || r.stdout != want {
						t.Errorf("on %s: exit %d %q, want %q; stderr %s", be, r.code, r.stdout, want, r.stderr)
					}
				}
			})
		}
	}
	if data, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(data), state) {
		t.Errorf("a mount of a template is left on the host:\n%s", data)
	}
	airlocktest.CheckNoLeftovers(t, namespaces.DefaultStateDir)
}

// A layer altered after its image was made (a byte of its padding
// flipped, its padding cut off, its gzip header changed) is refused by
// pull and by both imports alike, on one line, and nothing of it is
// stored.
func TestTemplateRefusesAlteredLayers(t *testing.T) {
	airlocktest.RequiresRoot(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	state := t.TempDir()
	root := t.TempDir()
	if err := imagetest.BusyboxTree(root); err != nil {
		t.Skip(err)
	}
	// stream and its padding: GNU tar's, by which the old code told it
	// from what was altered.
	stream, err := imagetest.Tar(imagetest.GNUTar, root, false)
	if err != nil {
		t.Fatal(err)
	}
	if imagetest.Padding(t, stream) < 512 {
		t.Fatalf("GNU tar wrote %d bytes of padding: the test tests nothing", imagetest.Padding(t, stream))
	}
	diffID, _ := imagetest.DiffID(stream)
	flipped := bytes.Clone(stream)
	flipped[len(flipped)-100] ^= 1
	refusal := func(digest v1.Hash) string {
		return "airlock: refused: layer 1 of 1: the layer's content does not match its digest " + digest.String()
	}
	check := func(t *testing.T, how string, r cliResult, want string) {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != 2 || lines[len(lines)-1] != want {
			t.Errorf("template %s: exit %d %q, want 2 and %q", how, r.code, r.stderr, want)
		}
	}
	for _, c := range []struct {
		name string
		blob []byte
	}{
		{"flipped", flipped},
		{"cut", stream[:len(stream)-512]},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The blob is what its digest names; the configuration gives
			// the diff ID of the stream as it was.
			for _, k := range imagetest.Kinds {
				l, err := imagetest.BlobLayer(c.blob, diffID, k.LayerType(false))
				if err != nil {
					t.Fatal(err)
				}
				img, err := imagetest.Image(k, []string{"PATH=/bin"}, "/srv", l)
				if err != nil {
					t.Fatal(err)
				}
				as := c.name + "-" + string(k)
				ref := strings.TrimPrefix(reg.URL, "http://") + "/world/" + as + ":1"
				tag, _ := name.ParseReference(ref)
				if err := remote.Write(tag, img); err != nil {
					t.Fatal(err)
				}
				check(t, "pull "+as, airlock(t, "", "template", "pull", as, ref, "--state-dir", state), refusal(diffID))
				archive := filepath.Join(t.TempDir(), "image.tar")
				if err := imagetest.WriteDockerSave(archive, img, "world/"+as+":1", k); err != nil {
					t.Fatal(err)
				}
				check(t, "import (docker save) "+as, airlock(t, "", "template", "import", as, archive, "--state-dir", state), refusal(diffID))
				dir := filepath.Join(t.TempDir(), "oci")
				if err := imagetest.WriteLayout(dir, img); err != nil {
					t.Fatal(err)
				}
				check(t, "import (OCI layout) "+as, airlock(t, "", "template", "import", as, dir, "--state-dir", state), refusal(diffID))
			}
		})
	}
	// A blob that is not its digest's, though gunzip finds the same stream
	// in it: an OCI layout's blob with a byte of its gzip header's time
	// changed.
	t.Run("blob", func(t *testing.T) {
		gz, err := imagetest.Tar(imagetest.GNUTar, root, true)
		if err != nil {
			t.Fatal(err)
		}
		l, err := imagetest.BlobLayer(gz, diffID, imagetest.OCI.LayerType(true))
		if err != nil {
			t.Fatal(err)
		}
		img, err := imagetest.Image(imagetest.OCI, []string{"PATH=/bin"}, "/srv", l)
		if err != nil {
			t.Fatal(err)
		}
		digest, _ := l.Digest()
		dir := filepath.Join(t.TempDir(), "oci")
		if err := imagetest.WriteLayout(dir, img); err != nil {
			t.Fatal(err)
		}
		altered := bytes.Clone(gz)
		altered[4] ^= 1 // MTIME, which gunzip does not check
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", digest.Hex), altered, 0o644); err != nil {
			t.Fatal(err)
		}
		check(t, "import (OCI layout) of an altered blob", airlock(t, "", "template", "import", "blob", dir, "--state-dir", state), refusal(digest))
	})
	if r := airlock(t, "", "template", "list", "--state-dir", state); strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("a refused layer made a template:\n%s", r.stdout)
	}
	if left, _ := os.ReadDir(filepath.Join(state, "images", "layers")); len(left) != 0 {
		t.Errorf("a refused layer was left in the store: %v", left)
	}
}
