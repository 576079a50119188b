package gvisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The agent's directory: where a gVisor sandbox's agent listens for the
// daemon. gVisor imports a host socket only once it is connected, so the
// daemon cannot hand the agent a listening socket as the namespaces
// backend does; the agent binds one in a host directory bound into the
// sandbox (runsc --host-uds=create), and gVisor's gofer makes it, and
// whatever else the sandbox makes there (a symlink, a FIFO, a file), as a
// real host file. The daemon is host root and connect(2), stat(2) and
// open(2) follow symlinks, so it never resolves a path in there:
//
//  1. The directory is a tmpfs of its own, a page and a few inodes: the
//     sandbox cannot fill the state directory's file system through it,
//     and no hard link reaches into it from another file system (EXDEV).
//  2. The daemon opens the directory before the sandbox starts and keeps
//     the descriptor; the socket is opened relative to it with openat2,
//     RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS and O_PATH|O_NOFOLLOW: a symlink
//     in its place is opened as itself, never followed.
//  3. What was opened must be a socket owned by the agent's uid (fstat).
//  4. It is connected through /proc/self/fd/N: the kernel connects to the
//     socket bound to that inode, which the sandbox cannot swap any more.
//  5. The peer, the process that listens (gVisor's gofer, for the agent),
//     must be in the sandbox's cgroup (SO_PEERCRED).
//
// A socket of the sandbox's own making in the agent's place talks to the
// sandbox's own code, which the sandbox's token holder reaches anyway.

// agentSocket is the agent socket's name in its directory.
const agentSocket = "agent.sock"

// agentDirOptions: one page of data, 4096 inodes, mode 0700 for the
// agent's uid. The agent needs the directory and its socket, but every
// snapshot of a running sandbox (runsc checkpoint --leave-running) leaves
// the socket it let go of bound in gVisor's gofer, its inode held: with
// 8 inodes, a sandbox's agent could not listen again after its sixth.
// 4096 inodes hold no data (the page bounds that) and at most a few MiB
// of the kernel's memory, charged to the sandbox's cgroup.
const agentDirOptions = "size=4k,nr_inodes=4096,mode=0700,uid=%d,gid=%d"

// errNotAgentSocket: something else than the agent's socket is in its
// place: the sandbox put it there.
var errNotAgentSocket = errors.New("the agent's socket was replaced by something else")

// agentDir is one sandbox's agent directory, held open.
type agentDir struct {
	path string
	fd   int // O_PATH|O_DIRECTORY, opened on the tmpfs when it was mounted
	uid  int // the agent's uid, the socket's owner
	// inSandbox reports whether a host process is the sandbox's.
	inSandbox func(pid int) (bool, error)
}

// makeAgentDir mounts a new agent directory at path for an agent running
// as uid (host uid = sandbox uid: gVisor's gofer does not remap), whose
// peers inSandbox must accept.
func makeAgentDir(path string, uid int, inSandbox func(pid int) (bool, error)) (*agentDir, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	// A directory of an earlier sandbox of this id (a restore) is made
	// again: nothing of what its sandbox left there is trusted.
	if err := removeAgentDir(path); err != nil {
		return nil, err
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		return nil, err
	}
	opts := fmt.Sprintf(agentDirOptions, uid, uid)
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("agent directory: mount tmpfs: %w", err)
	}
	// Opened now, before any sandbox can reach it: the descriptor is of
	// this tmpfs for good.
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		removeAgentDir(path)
		return nil, fmt.Errorf("agent directory: %w", err)
	}
	return &agentDir{path: path, fd: fd, uid: uid, inSandbox: inSandbox}, nil
}

// openSocket opens what is in the socket's place, never following it,
// and checks that it is the agent's socket. fs.ErrNotExist: none yet.
func (d *agentDir) openSocket() (*os.File, error) {
	fd, err := unix.Openat2(d.fd, agentSocket, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: agentSocket, Err: err}
	}
	f := os.NewFile(uintptr(fd), agentSocket)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || int(st.Uid) != d.uid {
		f.Close()
		return nil, errNotAgentSocket
	}
	return f, nil
}

// listening reports whether the agent's socket is in its place.
func (d *agentDir) listening() bool {
	f, err := d.openSocket()
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// absent reports whether nothing is in the socket's place: the agent let
// go of it.
func (d *agentDir) absent() bool {
	var st unix.Stat_t
	return errors.Is(unix.Fstatat(d.fd, agentSocket, &st, unix.AT_SYMLINK_NOFOLLOW), unix.ENOENT)
}

// dial connects to the agent's socket through its descriptor, and checks
// who listens on it.
func (d *agentDir) dial(ctx context.Context) (net.Conn, error) {
	f, err := d.openSocket()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		return nil, err
	}
	if err := d.checkPeer(c.(*net.UnixConn)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// checkPeer checks that the process listening at the other end of c is
// in the sandbox.
func (d *agentDir) checkPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err = errors.Join(cerr, err); err != nil {
		return fmt.Errorf("the agent's peer credentials: %w", err)
	}
	ok, err := d.inSandbox(int(cred.Pid))
	if err != nil || !ok {
		return errNotAgentSocket
	}
	return nil
}

// close lets go of the descriptor; removeAgentDir removes the directory.
func (d *agentDir) close() {
	if d.fd >= 0 {
		unix.Close(d.fd)
		d.fd = -1
	}
}

// removeAgentDir unmounts and removes an agent directory, if there is one
// at path. os.RemoveAll does not follow symlinks; after the unmount there
// is nothing of the sandbox's under path but what an older airlock,
// without the tmpfs, let it write.
func removeAgentDir(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount agent directory: %w", err)
	}
	return os.RemoveAll(path)
}
