package daemon

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// newImages is the image templates of a fresh store holding imgs, on
// the fake backend called "fake".
func newImages(t *testing.T, imgs ...*image.Image) (imageTemplates, sandbox.Backend) {
	t.Helper()
	store, err := image.Open(filepath.Join(t.TempDir(), "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if err := store.Save(img); err != nil {
			t.Fatal(err)
		}
	}
	backends := newBackends(t.TempDir(), "", fakes(t, "fake"), nil)
	be, _ := backends.get("fake")
	return imageTemplates{Store: store, Base: policy.Default(), PoolSize: 3, ReadyTimeout: time.Second, Backends: backends.get}, be
}

// TestImageTemplates: an image is a template of its name, as root, at
// most base's limits, with its environment and working directory; one
// with a start command keeps a warm pool.
func TestImageTemplates(t *testing.T) {
	base := policy.Default()
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	imgs, _ := newImages(t,
		&image.Image{Name: "py", Created: created, Config: image.Config{Env: []string{"PYTHONPATH=/srv"}, WorkingDir: "/srv"},
			Resources: image.Resources{CPUs: base.CPUs / 2, MemoryMB: base.MemoryBytes>>20 + 1024, DiskMB: 100}},
		&image.Image{Name: "web:v2", Created: created.Add(time.Second), Config: image.Config{StartCmd: "serve", ReadyCmd: "true"}})

	py, err := imgs.Template("py")
	if err != nil {
		t.Fatal(err)
	}
	p := py.Policy
	if py.Name != "py" || !p.Root || p.CPUs != base.CPUs/2 || p.MemoryBytes != base.MemoryBytes || p.DiskBytes != 100<<20 {
		t.Errorf("template py: %+v; want root, half base's CPUs, base's memory (the image asked for more), 100 MiB of disk", py)
	}
	if !slices.Contains(p.Env, "PYTHONPATH=/srv") || p.Workdir != "/srv" {
		t.Errorf("template py: env %v, workdir %q; want the image's", p.Env, p.Workdir)
	}
	if py.PoolSize != 0 || py.WarmSnapshot || py.Ready != nil {
		t.Errorf("template py without a start command: pool %d, warm %v, ready %v; want none", py.PoolSize, py.WarmSnapshot, py.Ready != nil)
	}

	// E2B's default tag is no part of the name.
	web, err := imgs.Template("web:v2:default")
	if err != nil {
		t.Fatal(err)
	}
	if web.Name != "web:v2" || web.PoolSize != 3 || !web.WarmSnapshot || web.Ready == nil {
		t.Errorf("template web: %+v; want a warm pool of 3 that waits to be ready", web)
	}
	if web.Version == "" || web.Version == py.Version {
		t.Errorf("versions %q and %q: want each image's own", web.Version, py.Version)
	}

	for _, name := range []string{"nope", "../py", "PY", ""} {
		if _, err := imgs.Template(name); !errors.Is(err, sandbox.ErrUnknownTemplate) {
			t.Errorf("template %q: %v, want ErrUnknownTemplate", name, err)
		}
	}
}

// TestSnapshotTemplates: a snapshot's template clones it on the backend
// it was taken on, under its own policy; one of a backend this server
// cannot run is refused without the cause's host paths.
func TestSnapshotTemplates(t *testing.T) {
	pol := policy.Default()
	pol.MemoryBytes = 300 << 20
	snap := func(name, backend string) *image.Image {
		return &image.Image{Name: name, Snapshot: &image.Snapshot{Dir: strings.Repeat("ab", 12), Sandbox: "i1", Template: "base", Backend: backend, Policy: pol}}
	}
	imgs, be := newImages(t, snap("snap", "fake"), snap("elsewhere", "gvisor"),
		&image.Image{Name: "broken", Snapshot: &image.Snapshot{Dir: "../../etc", Backend: "fake"}})

	tmpl, err := imgs.Template("snap")
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Backend != be || tmpl.Policy.MemoryBytes != 300<<20 || tmpl.PoolSize != 3 || filepath.Base(tmpl.Snapshot) != strings.Repeat("ab", 12) {
		t.Errorf("snapshot template %+v; want clones on the fake backend, under the snapshot's policy", tmpl)
	}

	_, err = imgs.Template("elsewhere")
	var pe *sandbox.PublicError
	if !errors.As(err, &pe) || !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "taken on the gvisor backend") {
		t.Errorf("a snapshot of another backend: %v, want a public ErrInvalid naming it", err)
	}
	if pe != nil && (pe.Cause == nil || strings.Contains(pe.Error(), fmt.Sprint(pe.Cause))) {
		t.Errorf("the client's message %q carries the cause %v", pe.Error(), pe.Cause)
	}

	if _, err := imgs.Template("broken"); err == nil || !strings.Contains(err.Error(), "is not a snapshot") {
		t.Errorf("a snapshot whose directory is no snapshot's: %v, want refused", err)
	}

	imgs.Backends = nil
	if _, err := imgs.Template("snap"); err == nil || !strings.Contains(err.Error(), "no backend to clone it on") {
		t.Errorf("without backends: %v, want refused", err)
	}
}
