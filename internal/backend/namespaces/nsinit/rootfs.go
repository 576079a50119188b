package nsinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"golang.org/x/sys/unix"
)

// hostDevices are the only device nodes in the sandbox's /dev.
var hostDevices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// buildRoot assembles the sandbox's root file system on a fresh tmpfs at
// dir and pivots into it. It runs as root of the sandbox's user namespace,
// inside its private mount namespace, so nothing here is visible to the host.
// Every failure aborts the sandbox.
//
// The user's mounts arrive as detached mount trees (see openMounts), one fd
// each in mounts (FDs.Mounts).
func buildRoot(dir string, c *Config, mounts []int, layers []int, layerSock int) error {
	// Private propagation first: without it, mounts below could propagate
	// back into the host's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if len(layers) > 0 {
		return buildImageRoot(dir, c, mounts, layers, layerSock)
	}
	// One size-limited tmpfs holds the whole writable part of the sandbox
	// (/tmp, /home/user, /dev/shm): the --disk limit, bounded by memory.
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", c.WritableBytes, c.WritableInodes)
	if err := unix.Mount("airlock", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount root tmpfs: %w", err)
	}
	r := rootBuilder{dir: dir}
	r.mkdir("usr", 0o755)
	r.bind("/usr", "usr", true)
	for _, name := range layout.HostRootLinks {
		r.mirror("/"+name, name)
	}
	// /etc is a tmpfs of its own, so that one recursive mount_setattr at
	// the end makes it and every entry bound into it read-only (one call
	// instead of one per entry: this is on every sandbox's start).
	r.mkdir("etc", 0o755)
	r.mount("airlock-etc", "etc", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0755")
	for _, name := range layout.HostEtc {
		if fi, err := os.Lstat("/etc/" + name); err == nil {
			r.bindEntry("/etc/"+name, "etc/"+name, fi)
		}
	}
	for name, content := range layout.GeneratedEtc(c.Networked) {
		r.write("etc/"+name, content, 0o644)
	}
	r.setattr("etc", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	r.mkdir("proc", 0o555)
	r.mount("proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	r.buildDev(nil)
	r.mkdir("tmp", 0o1777)
	r.mkdir("home", 0o755)
	r.mkdir(layout.Home[1:], 0o700)
	r.chown(layout.Home[1:], layout.UID, layout.GID)
	for i, m := range c.Mounts {
		if c.TrustMount && i == len(c.Mounts)-1 {
			r.attachOver(mounts[i], strings.TrimPrefix(m.Target, "/"))
			continue
		}
		r.attach(mounts[i], strings.TrimPrefix(m.Target, "/"))
	}
	r.mkdir(layout.CodeDir[1:], 0o755)
	for _, f := range c.Files {
		r.write(layout.CodeDir[1:]+"/"+f.Name, f.Data, 0o444)
	}
	if r.err != nil {
		return r.err
	}
	return pivot(dir)
}

// buildImageRoot is buildRoot for a sandbox of an image: the overlay of
// its layers (imageRoot) becomes the root first, and everything else is
// made inside it. The image is untrusted: its symlinks may point anywhere,
// and only once the host's file system is out of reach is any path of the
// image followed. What the sandbox needs of the host (device nodes, the
// user's mounts, the agent's binary) comes along as mounts already open.
func buildImageRoot(dir string, c *Config, mounts []int, layers []int, layerSock int) error {
	devs := map[string]int{}
	defer func() {
		for _, fd := range devs {
			unix.Close(fd)
		}
	}()
	for _, name := range hostDevices {
		fd, err := unix.OpenTree(unix.AT_FDCWD, "/dev/"+name, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("dev %s: %w", name, err)
		}
		devs[name] = fd
	}
	// A user namespace may mount a proc only where one is fully visible:
	// made now, attached once the root is the image's.
	proc, err := detachedProc()
	if err != nil {
		return err
	}
	devs["proc"] = proc
	img, err := imageRoot(dir, layers, c.WritableBytes, min(c.WritableInodes, MaxLayerEntries))
	if err != nil {
		return err
	}
	if c.ExportRoot {
		if err := sendUpper(layerSock, filepath.Join(dir, "u")); err != nil {
			return err
		}
	}
	if err := pivot(img.dir); err != nil {
		return err
	}
	r := &rootBuilder{dir: "/"}
	// Before /proc and /dev are there: the image's links reach only the
	// image's files.
	if c.TrustPEM != nil && r.addTrust(layout.CABundle[1:], c.TrustPEM) {
		c.Env = layout.MergeEnv(c.Env, layout.TrustEnv())
	}
	r.mkdir("proc", 0o555)
	r.attach(proc, "proc")
	delete(devs, "proc")
	r.buildDev(devs)
	clear(devs) // attached, and closed, by buildDev
	r.imageEtc(c.Networked)
	r.mkdir("tmp", 0o1777)
	r.mkdir(layout.Home[1:], 0o700)
	r.chown(layout.Home[1:], layout.UID, layout.GID)
	for i, m := range c.Mounts {
		r.attach(mounts[i], strings.TrimPrefix(m.Target, "/"))
	}
	r.mkdir(layout.CodeDir[1:], 0o755)
	for _, f := range c.Files {
		r.replace(layout.CodeDir[1:]+"/"+f.Name, f.Data, 0o444)
	}
	return r.err
}

// detachedProc makes a proc file system for the sandbox's pid namespace,
// mounted nowhere yet.
func detachedProc() (int, error) {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("proc: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("proc: %w", err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("proc: %w", err)
	}
	return fd, nil
}

// pivot makes dir the root, then detaches the old one: from then on the
// host's file system is unreachable by path.
func pivot(dir string) error {
	const old = ".oldroot"
	if err := os.Mkdir(filepath.Join(dir, old), 0o700); err != nil {
		return fmt.Errorf("pivot: %w", err)
	}
	if err := unix.PivotRoot(dir, filepath.Join(dir, old)); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	if err := unix.Unmount("/"+old, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := os.Remove("/" + old); err != nil {
		return fmt.Errorf("remove old root: %w", err)
	}
	return nil
}

// rootBuilder keeps the first error, so buildRoot reads as the list of
// what the root contains rather than a ladder of error checks.
type rootBuilder struct {
	dir string
	err error
}

func (r *rootBuilder) path(rel string) string { return filepath.Join(r.dir, rel) }

func (r *rootBuilder) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

// mkdir makes rel with the Unix mode bits mode (0o1777: sticky).
func (r *rootBuilder) mkdir(rel string, mode uint32) {
	if r.err != nil {
		return
	}
	p := r.path(rel)
	if err := os.MkdirAll(p, 0o755); err != nil {
		r.fail("mkdir %s: %w", rel, err)
		return
	}
	// Chmod explicitly, with the raw bits: MkdirAll applies the umask,
	// and os.FileMode(0o1777) is not sticky (os.ModeSticky is).
	if err := unix.Chmod(p, mode); err != nil {
		r.fail("chmod %s: %w", rel, err)
	}
}

func (r *rootBuilder) chown(rel string, uid, gid int) {
	if r.err == nil {
		if err := os.Chown(r.path(rel), uid, gid); err != nil {
			r.fail("chown %s: %w", rel, err)
		}
	}
}

func (r *rootBuilder) write(rel string, data []byte, mode os.FileMode) {
	if r.err != nil {
		return
	}
	if err := os.WriteFile(r.path(rel), data, mode); err != nil {
		r.fail("write %s: %w", rel, err)
		return
	}
	if err := os.Chmod(r.path(rel), mode); err != nil {
		r.fail("chmod %s: %w", rel, err)
	}
}

func (r *rootBuilder) symlink(target, rel string) {
	if r.err == nil {
		// An image may have one there already.
		if fi, err := os.Lstat(r.path(rel)); err == nil && !fi.IsDir() {
			os.Remove(r.path(rel))
		}
		if err := os.Symlink(target, r.path(rel)); err != nil {
			r.fail("symlink %s: %w", rel, err)
		}
	}
}

func (r *rootBuilder) mount(source, rel, fstype string, flags uintptr, data string) {
	if r.err == nil {
		if err := unix.Mount(source, r.path(rel), fstype, flags, data); err != nil {
			r.fail("mount %s on %s: %w", fstype, rel, err)
		}
	}
}

// mirror reproduces a host top-level entry: the same symlink, or a
// read-only bind of the directory. A missing entry is skipped.
func (r *rootBuilder) mirror(host, rel string) {
	fi, err := os.Lstat(host)
	switch {
	case err != nil:
		return
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(host)
		if err != nil {
			r.fail("readlink %s: %w", host, err)
			return
		}
		r.symlink(target, rel)
	case fi.IsDir():
		r.mkdir(rel, 0o755)
		r.bind(host, rel, true)
	}
}

// bindEntry binds host path src (whose Lstat is fi) at rel without
// setting attributes: the caller restricts the whole tree at once.
// Symlinks are recreated rather than followed.
func (r *rootBuilder) bindEntry(src, rel string, fi os.FileInfo) {
	if r.err != nil {
		return
	}
	dst := r.path(rel)
	var err error
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		var target string
		if target, err = os.Readlink(src); err == nil {
			err = os.Symlink(target, dst)
		}
		if err != nil {
			r.fail("link %s: %w", rel, err)
		}
		return
	case fi.IsDir():
		err = os.Mkdir(dst, 0o755)
	default:
		err = os.WriteFile(dst, nil, 0o644)
	}
	if err == nil {
		err = unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, "")
	}
	if err != nil {
		r.fail("bind %s: %w", src, err)
	}
}

// setattr sets attributes on the mount at rel and every mount below it.
func (r *rootBuilder) setattr(rel string, attrs uint64) {
	if r.err == nil {
		attr := unix.MountAttr{Attr_set: attrs}
		if err := unix.MountSetattr(unix.AT_FDCWD, r.path(rel), unix.AT_RECURSIVE, &attr); err != nil {
			r.fail("restrict %s: %w", rel, err)
		}
	}
}

// bind makes host path src visible at rel, recursively, never with setuid
// or device semantics, and read-only when asked. The read-only flag is set
// with mount_setattr on the whole tree: a plain MS_REMOUNT would leave
// submounts writable and, inside a user namespace, fails on locked flags.
func (r *rootBuilder) bind(src, rel string, readOnly bool) {
	if r.err != nil {
		return
	}
	fi, err := os.Stat(src)
	if err != nil {
		r.fail("bind %s: %w", src, err)
		return
	}
	dst := r.path(rel)
	if fi.IsDir() {
		err = os.MkdirAll(dst, 0o755)
	} else {
		err = os.MkdirAll(filepath.Dir(dst), 0o755)
		if err == nil {
			err = os.WriteFile(dst, nil, 0o644)
		}
	}
	if err != nil {
		r.fail("bind target %s: %w", rel, err)
		return
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		r.fail("bind %s: %w", src, err)
		return
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, dst, unix.AT_RECURSIVE, &attr); err != nil {
		r.fail("restrict bind %s: %w", rel, err)
	}
}

// attach moves the detached mount tree fd to rel, creating rel as a
// directory or a file to match, and closes fd.
// attachOver mounts the tree fd over the file rel of a root built of the
// host's entries, which is never changed: where there is none, fd is
// closed and nothing mounted.
func (r *rootBuilder) attachOver(fd int, rel string) {
	defer unix.Close(fd)
	if r.err != nil {
		return
	}
	fi, err := os.Lstat(r.path(rel))
	if err != nil || !fi.Mode().IsRegular() {
		return
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, r.path(rel), unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		r.fail("mount %s: %w", rel, err)
	}
}

func (r *rootBuilder) attach(fd int, rel string) {
	defer unix.Close(fd)
	if r.err != nil {
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		r.fail("mount %s: %w", rel, err)
		return
	}
	dst := r.path(rel)
	err := os.MkdirAll(filepath.Dir(dst), 0o755)
	if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = os.MkdirAll(dst, 0o755)
	} else if err == nil {
		// A file's mount point replaces what an image may have there, a
		// symlink too (which would otherwise be followed).
		if fi, lerr := os.Lstat(dst); lerr == nil && !fi.IsDir() {
			err = os.Remove(dst)
		}
		if err == nil {
			err = os.WriteFile(dst, nil, 0o644)
		}
	}
	if err != nil {
		r.fail("mount target %s: %w", rel, err)
		return
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		r.fail("mount %s: %w", rel, err)
	}
}

// buildDev creates a minimal /dev: a few harmless device nodes bound from
// the host (a user namespace cannot mknod), a private devpts instance for
// terminals, and /dev/shm on the sandbox's own tmpfs. The nodes are bound
// from their paths, or, once the host is out of reach, attached from the
// mounts in devs (by name), which it closes.
func (r *rootBuilder) buildDev(devs map[string]int) {
	r.mkdir("dev", 0o755)
	for _, name := range hostDevices {
		if r.err != nil {
			return
		}
		dst := r.path("dev/" + name)
		if fd, ok := devs[name]; ok {
			r.replace("dev/"+name, nil, 0o644)
			r.attach(fd, "dev/"+name)
		} else {
			if err := os.WriteFile(dst, nil, 0o644); err != nil {
				r.fail("dev %s: %w", name, err)
				return
			}
			if err := unix.Mount("/dev/"+name, dst, "", unix.MS_BIND, ""); err != nil {
				r.fail("bind /dev/%s: %w", name, err)
				return
			}
		}
		if r.err != nil {
			return
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(unix.AT_FDCWD, dst, 0, &attr); err != nil {
			r.fail("restrict /dev/%s: %w", name, err)
			return
		}
	}
	r.mkdir("dev/pts", 0o755)
	r.mount("devpts", "dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
	r.symlink("pts/ptmx", "dev/ptmx")
	r.mkdir("dev/shm", 0o1777)
	r.symlink("/proc/self/fd", "dev/fd")
	r.symlink("/proc/self/fd/0", "dev/stdin")
	r.symlink("/proc/self/fd/1", "dev/stdout")
	r.symlink("/proc/self/fd/2", "dev/stderr")
}

// errNoLandlock marks a kernel without Landlock, the one protection that
// is applied only where available.
var errNoLandlock = errors.New("landlock not supported by this kernel")
