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
