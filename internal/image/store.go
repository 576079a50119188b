// Package image keeps the OCI images that templates are made of: pulled
// from registries or imported from archives, their layers unpacked into a
// content-addressed store on the host, shared by every image that has
// them, ready to be stacked as overlayfs lower layers.
package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Image is an image in the store, as a template uses it.
type Image struct {
	Name    string    `json:"name"`
	Source  string    `json:"source"` // the reference or archive it came from
	Digest  string    `json:"digest"` // of its manifest
	Layers  []string  `json:"layers"` // diff IDs, bottom first
	Config  Config    `json:"config"`
	Size    int64     `json:"size"` // bytes of file contents, unpacked
	Created time.Time `json:"created"`
	// BuildKey identifies the build that made the image (its base and
	// steps): a build of the same key reuses it, unless forced.
	BuildKey string `json:"buildKey,omitempty"`
	// Resources its sandboxes ask for (E2B's cpuCount, memoryMB); zero:
	// the server's defaults. They never exceed the server's own limits.
	Resources Resources `json:"resources,omitzero"`
	// Snapshot, set, makes the image a snapshot of a running sandbox:
	// its sandboxes are cloned from the saved state, as it was.
	Snapshot *Snapshot `json:"snapshot,omitempty"`
}

// Snapshot is what a template of a snapshot has besides an image's: the
// saved state of a sandbox (in the store's snapshots/<Dir>/, the
// backend's files) and what its clones need to run as it did. Layers are
// the sandbox's image's, kept for as long as the snapshot is.
type Snapshot struct {
	Dir      string        `json:"dir"`
	Sandbox  string        `json:"sandbox"`  // the sandbox it was taken of
	Template string        `json:"template"` // that sandbox's template
	Backend  string        `json:"backend"`
	Policy   policy.Policy `json:"policy"`
	// Volumes are the volumes the sandbox mounted, which its clones
	// mount again.
	Volumes []SnapshotVolume `json:"volumes,omitempty"`
}

// SnapshotVolume is a volume a snapshot's sandbox mounted: its name and
// where.
type SnapshotVolume struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Resources are what a template's sandboxes ask for.
type Resources struct {
	CPUs     float64 `json:"cpus,omitempty"`
	MemoryMB int64   `json:"memoryMB,omitempty"`
	DiskMB   int64   `json:"diskMB,omitempty"`
}

// Config is what of an image's configuration a sandbox uses.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// StartCmd runs in the background when a sandbox of the image
	// starts, which is ready once ReadyCmd exits 0 (E2B's setStartCmd).
	StartCmd string `json:"startCmd,omitempty"`
	ReadyCmd string `json:"readyCmd,omitempty"`
}

// Store is an image store in a directory only host root reaches:
//
//	layers/<hex>/      a layer unpacked (sha256 of its uncompressed tar)
//	images/<name>.json the images, by name
//	snapshots/<hex>/   the saved state of a snapshot (Image.Snapshot)
type Store struct {
	dir    string
	limits Limits
	// shared are stores whose images and layers this one uses read-only
	// (Share): those of the stock templates, made once for many daemons.
	shared []*Store
}

// Share lets s use other's images and layers, read-only: Get and
// LayerDirs look there for what s lacks, so that s's templates may be
// built from other's images; s never writes, lists or prunes them.
func (s *Store) Share(other *Store) { s.shared = append(s.shared, other) }

// Open returns the store in dir, making it if needed.
func Open(dir string, lim Limits) (*Store, error) {
	for _, d := range []string{dir, filepath.Join(dir, "layers"), filepath.Join(dir, "images")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	// Only root may reach the layers: they keep their images' owners and
	// modes (setuid files of uid 0 among them).
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	return &Store{dir: dir, limits: lim}, nil
}

// Names are what templates are called: lower-case letters, digits and
// "-_.:", as E2B's aliases and name:tag.
var validName = lazyRegexp(`^[a-z0-9][a-z0-9._:-]{0,127}$`)

// CheckName reports whether n can name an image.
func CheckName(n string) error {
	if !validName().MatchString(n) || strings.Contains(n, "..") {
		return fmt.Errorf("template name %q: use 1 to 128 lower-case letters, digits and . _ : - (starting with a letter or digit)", n)
	}
	return nil
}

// Pull fetches ref (linux/amd64) from its registry and stores it as name.
// auth, when not nil, is the registry's credentials; otherwise the
// default keychain ($DOCKER_CONFIG) is asked.
func (s *Store) Pull(ctx context.Context, ref, imageName string, auth authn.Authenticator) (*Image, error) {
	return s.record(imageName, func() (*Image, error) { return s.Fetch(ctx, ref, auth, nil) })
}

// record stores the image fetch returns as name, held from a prune
// until its record is written.
func (s *Store) record(imageName string, fetch func() (*Image, error)) (*Image, error) {
	if err := CheckName(imageName); err != nil {
		return nil, err
	}
	release, err := s.Hold()
	if err != nil {
		return nil, err
	}
	defer release()
	rec, err := fetch()
	if err != nil {
		return nil, err
	}
	rec.Name = imageName
	return rec, s.Save(rec)
}

// Import stores the image of an archive as name: a `docker save` tar, or
// a directory holding an OCI image layout (its first image).
func (s *Store) Import(ctx context.Context, path, imageName string) (*Image, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("image archive: %v", errors.Unwrap(err))
	}
	var img v1.Image
	if fi.IsDir() {
		idx, err := ocilayout.ImageIndexFromPath(path)
		if err != nil {
			return nil, fmt.Errorf("%s is not an OCI image layout: %v", path, err)
		}
		m, err := idx.IndexManifest()
		if err != nil || len(m.Manifests) == 0 {
			return nil, fmt.Errorf("%s holds no image", path)
		}
		if img, err = idx.Image(m.Manifests[0].Digest); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		return s.Put(ctx, imageName, path, img)
	}
	if img, err = tarball.ImageFromPath(path, nil); err != nil {
		return nil, fmt.Errorf("%s is not an image archive (docker save): %v", path, err)
	}
	// A docker save archive names its layers by their diff IDs only: the
	// digests go-containerregistry gives them it computed itself, from the
	// archive (by compressing the layers, for most), so there is nothing
	// to check them against but the diff IDs, which are checked.
	return s.record(imageName, func() (*Image, error) { return s.unpack(ctx, path, img, false) })
}

// Put unpacks img's layers that the store lacks and records img as name,
// replacing an image of that name. Nothing of a refused image remains
// but the layers before the refused one, which other images may share.
func (s *Store) Put(ctx context.Context, imageName, source string, img v1.Image) (*Image, error) {
	return s.record(imageName, func() (*Image, error) { return s.Unpack(ctx, source, img) })
}

// Progress is told, as an image is stored, which layer is being
// unpacked and how many bytes of it so far (at most every half second,
// and once when each layer starts); cached layers are not reported.
type Progress func(layer, layers int, bytes int64)

type progressKey struct{}

// WithProgress returns ctx with p, which Pull, Fetch and Import report to.
func WithProgress(ctx context.Context, p Progress) context.Context {
	return context.WithValue(ctx, progressKey{}, p)
}

// Fetch is Pull without a name: the image's layers are stored, and the
// image is returned for a build to start from, recorded nowhere. A nil
// auth asks the default keychain ($DOCKER_CONFIG: the operator's
// credentials); transport, if not nil, carries every request.
func (s *Store) Fetch(ctx context.Context, ref string, auth authn.Authenticator, transport http.RoundTripper) (*Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %v", ref, err)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})}
	if auth != nil {
		opts = append(opts, remote.WithAuth(auth))
	} else {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	if transport != nil {
		opts = append(opts, remote.WithTransport(transport))
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	return s.Unpack(ctx, ref, img)
}

// Unpack stores the layers of img that the store lacks and returns its
// record, without a name. Each layer's blob must be the one its digest
// and size name, and its uncompressed stream the one its diff ID names,
// each to its last byte.
func (s *Store) Unpack(ctx context.Context, source string, img v1.Image) (*Image, error) {
	return s.unpack(ctx, source, img, true)
}

// unpack is Unpack, checking the layers' blobs against their digests if
// checkBlobs.
func (s *Store) unpack(ctx context.Context, source string, img v1.Image, checkBlobs bool) (*Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image configuration: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image layers: %w", err)
	}
	if len(layers) > s.limits.Layers {
		return nil, refuse("the image has %d layers, more than %d", len(layers), s.limits.Layers)
	}
	// The diff IDs are the configuration's: a layer's own DiffID is, for
	// an OCI layout's or a docker save archive's compressed layers, the
	// hash go-containerregistry computes of what it reads, which the
	// layer would match whatever it held.
	diffIDs := cf.RootFS.DiffIDs
	if len(diffIDs) != len(layers) {
		return nil, refuse("the image's configuration gives %d diff IDs for its %d layers", len(diffIDs), len(layers))
	}
	rec := &Image{Source: source, Digest: digest.String(), Created: time.Now().UTC(),
		Config: Config{Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
			Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd}}
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		want := diffIDs[i]
		var report func(int64)
		if p, ok := ctx.Value(progressKey{}).(Progress); ok {
			report = func(n int64) { p(i+1, len(layers), n) }
		}
		size, err := s.addLayer(l, want.String(), checkBlobs, s.limits.ImageBytes-rec.Size, report)
		if err != nil {
			return nil, fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
		rec.Size += size
		rec.Layers = append(rec.Layers, want.String())
	}
	return rec, nil
}

// Hold keeps Prune, in this process or another, from removing layers no
// image refers to yet, until release: an image being made (pulled,
// imported, built) has its layers in the store before its record.
func (s *Store) Hold() (release func(), err error) {
	lock, err := s.lockFile()
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH); err != nil {
		lock.Close()
		return nil, err
	}
	return func() { lock.Close() }, nil
}

func (s *Store) lockFile() (*os.File, error) {
	return os.OpenFile(filepath.Join(s.dir, "lock"), os.O_CREATE|os.O_RDONLY|unix.O_CLOEXEC, 0o600)
}

// Save records img under its name, replacing an image of that name.
func (s *Store) Save(img *Image) error {
	if err := CheckName(img.Name); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(img, "", "  ")
	return writeAtomic(s.imagePath(img.Name), data)
}

// AddLayer stores the uncompressed layer tar r (a build's writable layer,
// say) and returns its diff ID and size, with the checks and limits of
// any image's layer; budget bounds its size too.
func (s *Store) AddLayer(r io.Reader, budget int64) (diffID string, size int64, err error) {
	tmp, err := os.MkdirTemp(filepath.Join(s.dir, "layers"), ".new-")
	if err != nil {
		return "", 0, err
	}
	size, diffID, err = unpack(r, tmp, s.limits, min(budget, s.limits.ImageBytes))
	if err != nil {
		removeTree(tmp)
		return "", 0, err
	}
	dir, err := s.layerDir(diffID)
	if err == nil && dirExists(dir) {
		removeTree(tmp) // the store has it already
		return diffID, size, nil
	}
	if err == nil {
		err = s.place(tmp, dir, size)
	}
	if err != nil {
		removeTree(tmp)
		return "", 0, err
	}
	return diffID, size, nil
}

// Limits are the store's.
func (s *Store) Limits() Limits { return s.limits }

// addLayer unpacks l unless the store has it. It is unpacked aside and
// renamed into place, so that a layer in the store is always whole. With
// checkBlob, its blob is checked against its digest in the same pass.
func (s *Store) addLayer(l v1.Layer, diffID string, checkBlob bool, budget int64, report func(int64)) (int64, error) {
	dir, err := s.layerDir(diffID)
	if err != nil {
		return 0, err
	}
	if size, err := dirSize(dir); err == nil {
		return size, nil
	}
	var b *blob
	if checkBlob {
		if l, b, err = checking(l); err != nil {
			return 0, err
		}
	}
	rc, err := l.Uncompressed()
	if err != nil {
		// A decompressor reads the blob's first bytes at once: a blob
		// that is not the digest's may fail there.
		if b != nil && b.r != nil {
			if berr := b.finish(); berr != nil {
				return 0, berr
			}
		}
		return 0, fmt.Errorf("read layer: %w", err)
	}
	defer rc.Close()
	var r io.Reader = rc
	if report != nil {
		report(0)
		r = &counting{r: rc, report: report}
	}
	tmp, err := os.MkdirTemp(filepath.Join(s.dir, "layers"), ".new-")
	if err != nil {
		return 0, err
	}
	size, got, err := unpack(r, tmp, s.limits, budget)
	if b != nil {
		if berr := b.finish(); berr != nil {
			err = berr
		}
	}
	if err == nil && got != diffID {
		err = refuse("the layer's content does not match its digest %s", diffID)
	}
	if err == nil {
		err = s.place(tmp, dir, size)
	}
	if err != nil {
		removeTree(tmp)
		return 0, err
	}
	return size, nil
}

// place moves the unpacked layer tmp to its place dir in the store.
func (s *Store) place(tmp, dir string, size int64) error {
	if err := os.WriteFile(dir+".size", []byte(fmt.Sprint(size)), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil && !dirExists(dir) {
		return err // else another process stored it meanwhile
	}
	if dirExists(tmp) {
		removeTree(tmp)
	}
	return nil
}

func (s *Store) layerDir(diffID string) (string, error) {
	hexID, ok := strings.CutPrefix(diffID, "sha256:")
	if _, err := hex.DecodeString(hexID); !ok || err != nil || len(hexID) != 64 {
		return "", fmt.Errorf("layer digest %q is not a sha256", diffID)
	}
	return filepath.Join(s.dir, "layers", hexID), nil
}

// LayerDirs are the directories of img's layers, top first, as overlayfs
// takes lower layers.
func (s *Store) LayerDirs(img *Image) ([]string, error) {
	var dirs []string
	for _, id := range slices.Backward(img.Layers) {
		d, err := s.findLayer(id)
		if err != nil {
			return nil, fmt.Errorf("layer %s of %s: %w", id, img.Name, err)
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// findLayer is the directory of layer id, in s or a store it shares.
func (s *Store) findLayer(id string) (string, error) {
	d, err := s.layerDir(id)
	if err != nil {
		return "", err
	}
	if dirExists(d) {
		return d, nil
	}
	for _, o := range s.shared {
		if d, err := o.findLayer(id); err == nil {
			return d, nil
		}
	}
	return "", errors.New("missing from the store")
}

// Apply makes p a policy for sandboxes of img: its layers as the root,
// its environment under p's own, its working directory unless
// keepWorkdir.
func (s *Store) Apply(img *Image, p *policy.Policy, keepWorkdir bool) error {
	dirs, err := s.LayerDirs(img)
	if err != nil {
		return err
	}
	p.RootLayers = dirs
	p.Env = layout.MergeEnv(img.Config.Env, p.Env)
	if !keepWorkdir && strings.HasPrefix(img.Config.WorkingDir, "/") {
		p.Workdir = filepath.Clean(img.Config.WorkingDir)
	}
	return nil
}

// NewSnapshotDir names a directory for a new snapshot's saved state,
// which the backend makes; what no image names by then is pruned, so it
// is made under Hold.
func (s *Store) NewSnapshotDir() (name, dir string, err error) {
	var r [12]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "snapshots"), 0o700); err != nil {
		return "", "", err
	}
	name = hex.EncodeToString(r[:])
	return name, filepath.Join(s.dir, "snapshots", name), nil
}

// SnapshotDir is the directory of snapshot img's saved state.
func (s *Store) SnapshotDir(img *Image) (string, error) {
	if img.Snapshot == nil || !snapshotName().MatchString(img.Snapshot.Dir) {
		return "", fmt.Errorf("template %s is not a snapshot", img.Name)
	}
	return filepath.Join(s.dir, "snapshots", img.Snapshot.Dir), nil
}

var snapshotName = lazyRegexp(`^[0-9a-f]{24}$`)

func (s *Store) imagePath(n string) string { return filepath.Join(s.dir, "images", n+".json") }

// ErrNotFound: no image of that name.
var ErrNotFound = errors.New("no such template")

// Get returns the image called n.
func (s *Store) Get(n string) (*Image, error) {
	if err := CheckName(n); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(s.imagePath(n))
	if errors.Is(err, os.ErrNotExist) {
		for _, o := range s.shared {
			if img, err := o.Get(n); err == nil {
				return img, nil
			}
		}
		return nil, fmt.Errorf("%w %q", ErrNotFound, n)
	}
	if err != nil {
		return nil, err
	}
	var img Image
	if err := json.Unmarshal(data, &img); err != nil {
		return nil, fmt.Errorf("template %s: %v", n, err)
	}
	return &img, nil
}

// List returns every image, by name.
func (s *Store) List() ([]*Image, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, "images"))
	if err != nil {
		return nil, err
	}
	var out []*Image
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok && !strings.HasPrefix(n, ".") {
			if img, err := s.Get(n); err == nil {
				out = append(out, img)
			}
		}
	}
	return out, nil
}

// Remove deletes the image called n, then the layers no image has.
func (s *Store) Remove(n string) error {
	if err := CheckName(n); err != nil {
		return err
	}
	if err := os.Remove(s.imagePath(n)); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w %q", ErrNotFound, n) // a shared store's image too: not s's to remove
	} else if err != nil {
		return err
	}
	return s.Prune()
}

// removeTree removes a tree that may hold read-only directories.
func removeTree(dir string) error {
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

func writeAtomic(path string, data []byte) error {
	var r [8]byte
	rand.Read(r[:])
	tmp := filepath.Join(filepath.Dir(path), "."+hex.EncodeToString(r[:]))
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// counting reports the bytes read through it, at most every half second.
type counting struct {
	r      io.Reader
	n      int64
	last   time.Time
	report func(int64)
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if time.Since(c.last) > 500*time.Millisecond {
		c.last = time.Now()
		c.report(c.n)
	}
	return n, err
}

// lazyRegexp compiles expr at its first use, not at every start of the
// binary: a counted repetition such as {0,127} takes a fraction of a
// millisecond to compile, which airlock run would pay each time.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
