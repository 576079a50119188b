package sandbox

import (
	"errors"
	"fmt"
	"slices"

	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// VolumeMount is a volume mounted into a sandbox, as E2B names it: the
// volume's name and where it appears.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Volumes is what the manager needs of the volume store: a volume by
// name, and where it is mounted on the host.
type Volumes interface {
	ByName(name string) (*volume.Volume, error)
	Mountpoint(id string) (string, error)
}

// snapshotVolumes points the mounts of tmpl's volumes (a snapshot's) in
// pol at where those volumes are now: each looked up again by name (one
// deleted since is a 400 naming it; one made again under its name is
// mounted in its place, as E2B re-applies mounts by name).
func (m *Manager) snapshotVolumes(pol policy.Policy, tmpl *Template) (policy.Policy, error) {
	return m.repointVolumes(pol, tmpl.VolumeMounts, tmpl.Name)
}

// repointVolumes points the mounts of vms in pol (those of owner: a
// snapshot, or a sandbox saved to disk) at where their volumes are now.
func (m *Manager) repointVolumes(pol policy.Policy, vms []VolumeMount, owner string) (policy.Policy, error) {
	if len(vms) == 0 {
		return pol, nil
	}
	if m.cfg.Volumes == nil {
		return pol, fmt.Errorf("%w: %s mounts volumes, and this server has none", ErrInvalid, owner)
	}
	pol.Mounts = slices.Clone(pol.Mounts)
	for _, vm := range vms {
		v, err := m.cfg.Volumes.ByName(vm.Name)
		if errors.Is(err, volume.ErrNotFound) {
			return pol, fmt.Errorf("%w: %s mounts volume '%s' at %s, which is gone", ErrInvalid, owner, vm.Name, vm.Path)
		}
		if err != nil {
			return pol, err
		}
		src, err := m.cfg.Volumes.Mountpoint(v.ID)
		if err != nil {
			return pol, err
		}
		i := slices.IndexFunc(pol.Mounts, func(mt policy.Mount) bool { return mt.IDMapped && mt.Target == vm.Path })
		if i < 0 {
			return pol, fmt.Errorf("%s: no mount of volume %s at %s", owner, vm.Name, vm.Path)
		}
		pol.Mounts[i].Source = src
	}
	return pol, nil
}

// volumePolicy adds the mounts of vms to pol: each volume's mount point,
// read-write and idmapped (its files' owners are the sandboxes' ids). The
// sandbox sees its files as they are, shared with every other sandbox
// that mounts it.
func (m *Manager) volumePolicy(pol policy.Policy, vms []VolumeMount) (policy.Policy, error) {
	if len(vms) == 0 {
		return pol, nil
	}
	if m.cfg.Volumes == nil {
		return pol, fmt.Errorf("%w: this server has no volumes", ErrInvalid)
	}
	var problems []error
	mounts := slices.Clip(pol.Mounts)
	for i, vm := range vms {
		v, err := m.cfg.Volumes.ByName(vm.Name)
		if errors.Is(err, volume.ErrNotFound) {
			problems = append(problems, fmt.Errorf("volume mount #%d: volume '%s' not found", i, vm.Name))
			continue
		}
		if err != nil {
			return pol, err
		}
		src, err := m.cfg.Volumes.Mountpoint(v.ID)
		if err != nil {
			return pol, err
		}
		mounts = append(mounts, policy.Mount{Source: src, Target: vm.Path, IDMapped: true})
	}
	if len(problems) > 0 {
		return pol, fmt.Errorf("%w: invalid mounts: %w", ErrInvalid, errors.Join(problems...))
	}
	pol.Mounts = mounts
	if err := pol.Validate(); err != nil {
		return pol, fmt.Errorf("%w: volume mounts: %v", ErrInvalid, err)
	}
	return pol, nil
}
