package nsinit

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// The init side of an image's root: the layer mounts the host sends
// (package namespaces, layers.go) stacked under a writable layer.

// MaxLayerEntries bounds the files an exported layer may have (as
// image.DefaultLimits does the unpacking's), and the inodes of the
// writable layer's tmpfs.
const MaxLayerEntries = 1 << 20

// receiveLayers reads the n layer mounts the host sends on fd.
func receiveLayers(fd, n int) ([]int, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(n*4))
	_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("receive image layers: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("receive image layers: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		return nil, fmt.Errorf("receive image layers: %w", err)
	}
	if len(fds) != n {
		for _, f := range fds {
			unix.Close(f)
		}
		return nil, fmt.Errorf("receive image layers: got %d of %d", len(fds), n)
	}
	return fds, nil
}

// imageRoot mounts the sandbox's root from the layer mounts (top first)
// at dir/root and returns its builder: a tmpfs of diskBytes and inodes at
// dir holds the writable layer (u), overlayfs' work directory (w) and the
// layers' mount points (l/N).
func imageRoot(dir string, layers []int, diskBytes, inodes int64) (*rootBuilder, error) {
	// nr_inodes: the files of a layer are bounded, and so is the kernel
	// memory their inodes take.
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", diskBytes, inodes)
	if err := unix.Mount("airlock", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return nil, fmt.Errorf("mount root tmpfs: %w", err)
	}
	base := rootBuilder{dir: dir}
	var lower []string
	for i, fd := range layers {
		rel := "l/" + strconv.Itoa(i)
		base.attach(fd, rel)
		lower = append(lower, rel)
	}
	base.mkdir("u", 0o755)
	base.mkdir("w", 0o755)
	base.mkdir("root", 0o755)
	if base.err != nil {
		return nil, base.err
	}
	// Relative paths, from dir: the option string has a page's room.
	// userxattr: inside a user namespace overlayfs keeps its own marks
	// (opaque directories, whiteouts of the upper layer) in user.* xattrs.
	if err := unix.Chdir(dir); err != nil {
		return nil, err
	}
	data := "lowerdir=" + strings.Join(lower, ":") + ",upperdir=u,workdir=w,userxattr"
	if err := unix.Mount("airlock", "root", "overlay", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return nil, fmt.Errorf("mount the image's root (overlayfs): %w", err)
	}
	return &rootBuilder{dir: filepath.Join(dir, "root")}, nil
}

// imageEtc writes into an image's /etc what every sandbox is given: its
// host name and network, and the sandbox user, where the image lacks one.
func (r *rootBuilder) imageEtc(networked bool) {
	gen := layout.GeneratedEtc(networked)
	r.mkdir("etc", 0o755)
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		r.replace("etc/"+name, gen[name], 0o644)
	}
	r.appendMissing("etc/passwd", layout.User+":",
		fmt.Sprintf("%s:x:%d:%d:%s:%s:/bin/sh\n", layout.User, layout.UID, layout.GID, layout.User, layout.Home))
	r.appendMissing("etc/group", layout.User+":",
		fmt.Sprintf("%s:x:%d:\n", layout.User, layout.GID))
}

// replace writes rel, replacing whatever the image has there (a symlink
// included: it is never followed).
func (r *rootBuilder) replace(rel string, data []byte, mode os.FileMode) {
	if r.err != nil {
		return
	}
	if err := os.Remove(r.path(rel)); err != nil && !os.IsNotExist(err) {
		r.fail("replace %s: %w", rel, err)
		return
	}
	r.write(rel, data, mode)
}

// appendMissing adds line to the file rel unless a line starts with
// prefix; a missing file is made.
func (r *rootBuilder) appendMissing(rel, prefix, line string) {
	if r.err != nil {
		return
	}
	p := r.path(rel)
	fi, err := os.Lstat(p)
	if err == nil && !fi.Mode().IsRegular() {
		r.fail("%s in the image is not a regular file", rel)
		return
	}
	data, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		r.fail("read %s: %w", rel, err)
		return
	}
	for _, l := range bytes.Split(data, []byte("\n")) {
		if bytes.HasPrefix(l, []byte(prefix)) {
			return
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	r.write(rel, append(data, line...), 0o644)
}

// addTrust adds the egress CA (block) to the image's store rel, unless
// it holds it already (a root made from a snapshot of a sandbox that had
// it), and reports whether the store now holds the image's roots and the
// CA. An image without a store, or whose store is anything but a regular
// file reached without a link, is left as it is: only the sandbox's own
// verifications of intercepted hosts fail. The store is replaced, never
// written through (a new file renamed over it).
func (r *rootBuilder) addTrust(rel string, block []byte) bool {
	if r.err != nil {
		return false
	}
	root, err := unix.Open(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), rel)
	fi, err := f.Stat()
	var data []byte
	if err == nil && fi.Mode().IsRegular() && fi.Size() > 0 && fi.Size() < 16<<20 {
		data, err = io.ReadAll(f)
	}
	f.Close()
	switch {
	case err != nil || len(data) == 0:
		return false
	case bytes.Contains(data, block):
		return true
	}
	if data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	// Its directory has no link (openat2 said so); the new file's name is
	// made afresh, never opened through whatever the image put there.
	tmp := r.path(rel + ".airlock-new")
	os.Remove(tmp)
	nf, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, fi.Mode().Perm())
	if err == nil {
		_, err = nf.Write(append(data, block...))
		if cerr := nf.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(tmp, r.path(rel))
	}
	if err != nil {
		os.Remove(tmp)
		r.fail("add the egress CA to %s: %w", rel, err)
		return false
	}
	return true
}

// sendUpper sends the host, on the layers' socket, a descriptor of the
// writable layer's directory: a template build reads it back as a layer
// once its steps ran (Sandbox.exportRoot). It is sent before the pivot,
// while the directory still has a path here.
func sendUpper(sock int, dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("writable layer: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendmsg(sock, []byte{1}, unix.UnixRights(fd), nil, 0); err != nil {
		return fmt.Errorf("send the writable layer: %w", err)
	}
	return nil
}
