package backend

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A mount of the host's (airlock run --mount SRC:DST[:rw]) is the only
// host path a sandbox is given. Its source is resolved as root, and a
// directory on that path may be one an earlier sandbox had read-write: a
// symlink it left there would then give a later sandbox whatever it
// names. So a source is opened once, never following a symlink (openat2,
// RESOLVE_NO_SYMLINKS), and from then on only its descriptor is used.

// OpenMountSource opens the source of a host mount (O_PATH), refusing a
// path with a symbolic link anywhere in it.
func OpenMountSource(path string) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("mount source %s: its path has a symbolic link: give the path it leads to", path)
	case err != nil:
		return nil, fmt.Errorf("mount source %s does not exist or is not accessible", path)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// CloneMount returns m's source as a detached mount tree (open_tree) with
// its final attributes: private (a clone keeps the host mount's shared
// propagation, and mounts made below it in the sandbox would appear on the
// host), nosuid, nodev, and read-only unless m is writable. A source of
// the operator's is opened without following symlinks (OpenMountSource);
// follow is for the daemon's own files (the sandbox binary), in
// directories no sandbox writes.
func CloneMount(m policy.Mount, follow bool) (*os.File, error) {
	var fd int
	var err error
	if follow {
		fd, err = unix.OpenTree(unix.AT_FDCWD, m.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	} else {
		src, oerr := OpenMountSource(m.Source)
		if oerr != nil {
			return nil, oerr
		}
		fd, err = unix.OpenTree(int(src.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
		src.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("mount source %s: %w", m.Source, err)
	}
	tree := os.NewFile(uintptr(fd), m.Source)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if m.ReadOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		tree.Close()
		return nil, fmt.Errorf("mount %s: %w", m.Source, err)
	}
	return tree, nil
}
