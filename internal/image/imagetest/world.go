package imagetest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Writer is a program that writes tar archives. Images in the world are
// made with each, and each ends its archives its own way.
type Writer string

const (
	// GNUTar is the tar binary, run as `tar -c`: its archives are padded
	// with zeros to a record of 10,240 bytes (blocking factor 20).
	GNUTar Writer = "gnu-tar"
	// Python is Python's tarfile (Debian's /usr/bin/python3), which pads
	// to a record of 10,240 bytes too.
	Python Writer = "python"
	// Go is Go's archive/tar: two zero blocks at the end, no padding.
	Go Writer = "go"
)

// Writers are every Writer.
var Writers = []Writer{GNUTar, Python, Go}

// Python3 is Debian's Python, not a shim a PATH may put first.
const Python3 = "/usr/bin/python3"

// Tar returns the tree dir as the archive w writes of it, its entries
// named "./…", gzip-compressed by w's own means (tar -z, tarfile's
// "w:gz", compress/gzip) if gz.
func Tar(w Writer, dir string, gz bool) ([]byte, error) {
	switch w {
	case GNUTar:
		args := []string{"-c", "-f", "-", "-C", dir, "."}
		if gz {
			args = append([]string{"-z"}, args...)
		}
		var stderr bytes.Buffer
		cmd := exec.Command("tar", args...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("tar: %v: %s", err, stderr.Bytes())
		}
		return out, nil
	case Python:
		tmp, err := os.CreateTemp("", "imagetest-*.tar")
		if err != nil {
			return nil, err
		}
		tmp.Close()
		defer os.Remove(tmp.Name())
		mode := "w"
		if gz {
			mode = "w:gz"
		}
		script := "import sys, tarfile\nwith tarfile.open(sys.argv[1], sys.argv[2]) as t:\n    t.add(sys.argv[3], arcname='.')\n"
		if out, err := exec.Command(Python3, "-c", script, tmp.Name(), mode, dir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("python3 tarfile: %v: %s", err, out)
		}
		return os.ReadFile(tmp.Name())
	case Go:
		return goTar(dir, gz)
	}
	return nil, fmt.Errorf("no tar writer %q", w)
}

// goTar writes dir with archive/tar, as pushRoot in tests/mkimage does.
func goTar(dir string, gz bool) ([]byte, error) {
	var buf bytes.Buffer
	var out io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		out = zw
	}
	tw := tar.NewWriter(out)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name, hdr.Uname, hdr.Gname = path.Join(".", rel), "", ""
		if hdr.Name != "." {
			hdr.Name = "./" + hdr.Name
		}
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(data)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil && zw != nil {
		err = zw.Close()
	}
	return buf.Bytes(), err
}

// WriteTree makes entries in the directory dir, as files of the host.
func WriteTree(dir string, entries []Entry) error {
	for _, e := range entries {
		p := filepath.Join(dir, e.Name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(e.Mode & 0o777)
		var err error
		switch e.Type {
		case tar.TypeDir:
			if mode == 0 {
				mode = 0o755
			}
			if err = os.MkdirAll(p, mode); err == nil {
				err = os.Chmod(p, fileMode(e.Mode, mode))
			}
		case tar.TypeSymlink:
			err = os.Symlink(e.Link, p)
		default:
			if mode == 0 {
				mode = 0o644
			}
			if err = os.WriteFile(p, []byte(e.Body), mode); err == nil {
				err = os.Chmod(p, mode)
			}
		}
		if err == nil && e.UID != 0 {
			err = os.Lchown(p, e.UID, e.UID)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func fileMode(m int64, perm os.FileMode) os.FileMode {
	if m&0o1000 != 0 {
		perm |= os.ModeSticky
	}
	return perm
}

// BusyboxTree makes in dir the root BusyboxImage has as its first layer.
func BusyboxTree(dir string) error {
	entries, err := busyboxEntries()
	if err != nil {
		return err
	}
	if err := WriteTree(dir, entries); err != nil {
		return err
	}
	// The tree's own directory is the image's root: "./" in its layer.
	return os.Chmod(dir, 0o755)
}

// DiffID is the sha256 of blob's whole uncompressed stream, gunzipped if
// it is gzip: its padding, after the archive's end, included.
func DiffID(blob []byte) (v1.Hash, error) {
	stream, err := gunzip(blob)
	if err != nil {
		return v1.Hash{}, err
	}
	sum := sha256.Sum256(stream)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, nil
}

// Uncompressed is blob gunzipped if it is gzip, else blob.
func Uncompressed(t testing.TB, blob []byte) []byte {
	t.Helper()
	stream, err := gunzip(blob)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

func gunzip(blob []byte) ([]byte, error) {
	if !bytes.HasPrefix(blob, []byte{0x1f, 0x8b}) {
		return blob, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// Padding is how many bytes of a tar stream follow its archive's end.
func Padding(t testing.TB, stream []byte) int {
	t.Helper()
	r := bytes.NewReader(stream)
	tr := tar.NewReader(r)
	for {
		if _, err := tr.Next(); errors.Is(err, io.EOF) {
			return r.Len()
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// Kind is the family of media types an image is given: its manifest's,
// its configuration's and its layers'.
type Kind string

const (
	OCI    Kind = "oci"
	Docker Kind = "docker"
)

// Kinds are every Kind.
var Kinds = []Kind{OCI, Docker}

// LayerType is the media type of a layer of kind k, gzip or not.
func (k Kind) LayerType(gz bool) types.MediaType {
	switch {
	case k == OCI && gz:
		return types.OCILayer
	case k == OCI:
		return types.OCIUncompressedLayer
	case gz:
		return types.DockerLayer
	}
	return types.DockerUncompressedLayer
}

// BlobLayer is a layer whose blob is blob, byte for byte, as a registry
// or an archive holds it; its diff ID, as the image's configuration gives
// it, is diffID, which is not checked here.
func BlobLayer(blob []byte, diffID v1.Hash, mt types.MediaType) (v1.Layer, error) {
	return partial.CompressedToLayer(&blobLayer{blob: blob, diffID: diffID, mt: mt})
}

type blobLayer struct {
	blob   []byte
	diffID v1.Hash
	mt     types.MediaType
}

func (l *blobLayer) Digest() (v1.Hash, error) {
	sum := sha256.Sum256(l.blob)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, nil
}
func (l *blobLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *blobLayer) Size() (int64, error)                { return int64(len(l.blob)), nil }
func (l *blobLayer) MediaType() (types.MediaType, error) { return l.mt, nil }
func (l *blobLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}

// Image is an image of kind k made of layers, for linux/amd64, with env
// and workdir in its configuration.
func Image(k Kind, env []string, workdir string, layers ...v1.Layer) (v1.Image, error) {
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf.Config.Env, cf.Config.WorkingDir = env, workdir
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	if k == OCI {
		return mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON), nil
	}
	return mutate.ConfigMediaType(mutate.MediaType(img, types.DockerManifestSchema2), types.DockerConfigJSON), nil
}

// WriteLayout writes img as the OCI image layout dir, its blobs as they
// are.
func WriteLayout(dir string, img v1.Image) error {
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return lp.AppendImage(img)
}

// WriteDockerSave writes img to path as `docker save` does, tagged tag:
// for kind Docker as Docker before version 25 did (<id>/layer.tar,
// <id>.json), for OCI as Docker 25 and later do (an OCI image layout, its
// blobs named by digest, with a manifest.json beside it). The layers'
// blobs are written as they are, gzip or not.
func WriteDockerSave(path string, img v1.Image, tag string, k Kind) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cfgSum := sha256.Sum256(cfg)
	cfgHex := hex.EncodeToString(cfgSum[:])
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	type entry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	m := entry{RepoTags: []string{tag}}
	if k == OCI {
		m.Config = "blobs/sha256/" + cfgHex
	} else {
		m.Config = cfgHex + ".json"
	}
	if err := add(m.Config, cfg); err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		blob, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		name := d.Hex + "/layer.tar"
		if k == OCI {
			name = "blobs/sha256/" + d.Hex
		}
		if err := add(name, blob); err != nil {
			return err
		}
		m.Layers = append(m.Layers, name)
	}
	if k == OCI {
		raw, err := img.RawManifest()
		if err != nil {
			return err
		}
		md, err := img.Digest()
		if err != nil {
			return err
		}
		if err := add("blobs/sha256/"+md.Hex, raw); err != nil {
			return err
		}
		mt, _ := img.MediaType()
		index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": types.OCIImageIndex,
			"manifests": []map[string]any{{"mediaType": mt, "digest": md.String(), "size": len(raw),
				"annotations": map[string]string{"io.containerd.image.name": tag}}}})
		if err := add("index.json", index); err != nil {
			return err
		}
		if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
			return err
		}
	}
	manifest, _ := json.Marshal([]entry{m})
	if err := add("manifest.json", manifest); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
