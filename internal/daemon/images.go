package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// imageTemplates makes the templates of an image store: each image is a template
// of its name, with the limits of base (or less, as the image asks) and
// root inside. One with a start command keeps PoolSize sandboxes ready,
// started and ready-checked, once it has been asked for.
type imageTemplates struct {
	Store        *image.Store
	Base         policy.Policy
	PoolSize     int
	ReadyTimeout time.Duration
	// Backends finds the backend a snapshot was taken on, which alone
	// can clone it.
	Backends func(name string) (sandbox.Backend, error)
}

// Template returns the template of the image called name.
func (s imageTemplates) Template(name string) (sandbox.Template, error) {
	name = build.Normalize(name)
	img, err := s.Store.Get(name)
	if errors.Is(err, image.ErrNotFound) || image.CheckName(name) != nil {
		return sandbox.Template{}, fmt.Errorf("%w %q", sandbox.ErrUnknownTemplate, name)
	}
	if err != nil {
		return sandbox.Template{}, err
	}
	if img.Snapshot != nil {
		return s.snapshot(img)
	}
	p := s.Base
	if err := s.Store.Apply(img, &p, false); err != nil {
		return sandbox.Template{}, err
	}
	// Its agent runs as the sandbox's root, so that commands and files
	// may be root's or the user's, as E2B's templates have both.
	p.Root = true
	r := img.Resources
	if r.CPUs > 0 {
		p.CPUs = min(p.CPUs, r.CPUs)
	}
	if r.MemoryMB > 0 {
		p.MemoryBytes = min(p.MemoryBytes, r.MemoryMB<<20)
	}
	if r.DiskMB > 0 {
		p.DiskBytes = min(p.DiskBytes, r.DiskMB<<20)
	}
	t := sandbox.Template{Name: name, Policy: p, Version: img.Created.String() + strings.Join(img.Layers, ",")}
	if img.Config.StartCmd != "" {
		cfg := img.Config
		t.PoolSize, t.WarmSnapshot = s.PoolSize, true
		t.Ready = func(ctx context.Context, c *agentproto.Client) error {
			return build.Start(ctx, c, &cfg, s.ReadyTimeout, func(string, string) {})
		}
	}
	return t, nil
}

// snapshot is the template of snapshot img: clones of the sandbox it was
// taken of, under that sandbox's policy, kept ready as an image's with a
// start command are.
func (s imageTemplates) snapshot(img *image.Image) (sandbox.Template, error) {
	dir, err := s.Store.SnapshotDir(img)
	if err != nil {
		return sandbox.Template{}, err
	}
	if s.Backends == nil {
		return sandbox.Template{}, fmt.Errorf("template %s: no backend to clone it on", img.Name)
	}
	be, err := s.Backends(img.Snapshot.Backend)
	if err != nil {
		// The cause names host paths (where runsc was looked for).
		return sandbox.Template{}, &sandbox.PublicError{Cause: err, Err: fmt.Errorf("%w: snapshot %s was taken on the %s backend, which this server cannot run (the server log says why)",
			sandbox.ErrInvalid, img.Name, img.Snapshot.Backend)}
	}
	var volumes []sandbox.VolumeMount
	for _, v := range img.Snapshot.Volumes {
		volumes = append(volumes, sandbox.VolumeMount{Name: v.Name, Path: v.Path})
	}
	return sandbox.Template{Name: img.Name, Policy: img.Snapshot.Policy, Backend: be, Snapshot: dir,
		PoolSize: s.PoolSize, Version: img.Created.String() + img.Snapshot.Dir, VolumeMounts: volumes}, nil
}
