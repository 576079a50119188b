package namespaces

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A sandbox of a template has the template's image as its root: the
// image's layers (host directories of the image store, owned by the
// image's own ids, 0 for root) stacked read-only as overlayfs lower
// layers under a writable layer on a tmpfs of the disk limit.
//
// The layers reach init as mounts, not paths: the host clones each one
// into a detached mount that is idmapped through the sandbox's own user
// namespace (so that the image's root is the sandbox's root, and on the
// host the sandbox's ids own nothing of the store), read-only, and passes
// them over a socket once init's user namespace exists. Init mounts the
// overlay inside its user namespace and mount namespace: the host sees
// none of it.

// sendLayers clones dirs (an image's layers, read-only) and then mounts
// (the policy's idmapped ones: volumes) as idmapped mounts for the user
// namespace of init and sends them over sock. The namespace is opened by
// pid, then init checked alive through its pidfd (as initRoot does):
// alive after the open, it was init's namespace that was opened.
//
// An idmapped mount shows a file the disk says uid k owns as owned by
// what k is in init's user namespace (uid_map: k -> the sandbox's host
// base + k), and stores what the sandbox's uid k writes as k: the same
// ids in every sandbox that mounts it, none of them the host's.
func sendLayers(sock *os.File, init initProc, dirs []string, mounts []policy.Mount) error {
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", init.Pid()))
	if err != nil {
		return fmt.Errorf("sandbox user namespace: %w", err)
	}
	defer userns.Close()
	if err := init.Signal(0); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, dir := range dirs {
		fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("image layer: %w", err)
		}
		fds = append(fds, fd)
		attr := unix.MountAttr{
			Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Userns_fd: uint64(userns.Fd()),
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return fmt.Errorf("image layer: idmapped mount: %w (the image store's file system must support idmapped mounts)", err)
		}
	}
	for _, m := range mounts {
		// Cloned as every policy mount is (never through a symlink,
		// private, nosuid, nodev), then idmapped: an idmap can be set
		// only on a mount without submounts, so the clone is of m alone.
		src, err := backend.OpenMountSource(m.Source)
		if err != nil {
			return fmt.Errorf("mount %s: %w", m.Target, err)
		}
		fd, err := unix.OpenTree(int(src.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		src.Close()
		if err != nil {
			return fmt.Errorf("mount %s: %w", m.Target, err)
		}
		fds = append(fds, fd)
		attr := unix.MountAttr{
			Attr_set:    unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Propagation: unix.MS_PRIVATE,
			Userns_fd:   uint64(userns.Fd()),
		}
		if m.ReadOnly {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return fmt.Errorf("mount %s: idmapped mount: %w", m.Target, err)
		}
	}
	// One message: at most 253 descriptors travel at once, and an image
	// has at most 127 layers.
	return unix.Sendmsg(int(sock.Fd()), []byte{byte(len(fds))}, unix.UnixRights(fds...), nil, 0)
}

// receiveUpper takes the descriptor sendUpper sent, which init sent
// before it reported that the sandbox runs.
func receiveUpper(sock *os.File) (*os.File, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
	if err != nil {
		return nil, fmt.Errorf("receive the writable layer: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("receive the writable layer: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, f := range fds {
			unix.Close(f)
		}
		return nil, fmt.Errorf("receive the writable layer: %v", err)
	}
	return os.NewFile(uintptr(fds[0]), "upper"), nil
}

// idMapped are the idmapped ones of mounts.
func idMapped(mounts []policy.Mount) []policy.Mount {
	var out []policy.Mount
	for _, m := range mounts {
		if m.IDMapped {
			out = append(out, m)
		}
	}
	return out
}
