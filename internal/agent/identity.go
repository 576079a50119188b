package agent

import (
	"errors"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// identity is who a request acts as inside the sandbox.
type identity struct {
	name     string
	uid, gid int
	home     string
}

var (
	sandboxUser = identity{"user", 1000, 1000, "/home/user"}
	rootUser    = identity{"root", 0, 0, "/root"}
)

// who returns the identity a request asks for (envd names it in Basic
// authorization): "user" by default. "root" exists only where the agent
// itself runs as root, in a sandbox of a template made from an image;
// elsewhere everything runs as "user", and saying otherwise would be a
// lie.
func (a *Agent) who(r *http.Request) (identity, error) {
	switch u := userFromRequest(r); u {
	case "", "user":
		return a.userIdentity(), nil
	case "root":
		if a.root {
			return rootUser, nil
		}
		return identity{}, rpc.Errorf(agentproto.CodePermissionDenied, "user \"root\" is not available in this sandbox: its template runs everything as \"user\" (templates made from images have root)")
	default:
		return identity{}, rpc.Errorf(agentproto.CodePermissionDenied, "user %q is not available: this sandbox has \"user\"%s", strings.TrimSpace(u), map[bool]string{true: " and \"root\""}[a.root])
	}
}

// userIdentity is the sandbox user, with the home the agent was given.
func (a *Agent) userIdentity() identity {
	id := sandboxUser
	id.home = a.home
	return id
}

// credential is what a process started for id runs as: nothing changes
// where the agent is id already.
func (a *Agent) credential(id identity) *syscall.Credential {
	if !a.root || id.uid == 0 {
		return nil
	}
	return &syscall.Credential{Uid: uint32(id.uid), Gid: uint32(id.gid), Groups: []uint32{uint32(id.gid)}}
}

// envFor is a process's environment for id.
func (a *Agent) envFor(id identity, extra map[string]string) []string {
	env := a.env(extra)
	if id.uid == 0 {
		for i, kv := range env {
			switch k, _, _ := strings.Cut(kv, "="); k {
			case "HOME":
				env[i] = "HOME=" + id.home
			case "USER", "LOGNAME":
				env[i] = k + "=" + id.name
			}
		}
	}
	return env
}

// resolveAs makes p absolute for id: "~" is id's home, relative paths
// start there.
func (a *Agent) resolveAs(id identity, p string) string {
	switch {
	case p == "~":
		return id.home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(id.home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(id.home, p)
	}
	return filepath.Clean(p)
}

// as runs f with the file-system identity of id: where the agent is root
// and id is not, on a thread whose effective uid, gid and groups are id's
// (its saved uid stays 0, to come back) and whose effective set holds
// none of the capabilities that override file permissions, so that the
// kernel checks every access as it would id's own, and what f makes is
// id's. All of it is per thread (raw syscalls, not Go's, which change
// every thread); the process's own ids never change. Not setfsuid: gVisor
// does not implement it. The capabilities are dropped explicitly too:
// Linux drops them with the uid, gVisor might not.
func (a *Agent) as(id identity, f func() error) error {
	if !a.root || id.uid == 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := actAs(id)
		if err != nil {
			errc <- rpc.Errorf(agentproto.CodeInternal, "cannot act as %s: %v", id.name, err)
			return // the thread stays locked, and goes
		}
		err = f()
		if restore() {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// fsCaps are the capabilities that override file permissions (the
// kernel's CAP_FS_MASK).
var fsCaps = []uint{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER,
	unix.CAP_FSETID, unix.CAP_MKNOD, unix.CAP_LINUX_IMMUTABLE, unix.CAP_MAC_OVERRIDE}

// actAs makes the calling (locked) thread id for file access, and returns
// what undoes it, which reports whether the thread is root's again. On
// any failure the thread is left as it is: the caller abandons it.
func actAs(id identity) (restore func() bool, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var saved [2]unix.CapUserData
	if err := unix.Capget(&hdr, &saved[0]); err != nil {
		return nil, err
	}
	groups := make([]uint32, 64)
	n, _, errno := syscall.RawSyscall(syscall.SYS_GETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0)
	if errno != 0 {
		return nil, errno
	}
	groups = groups[:n]
	restore = func() bool {
		// euid 0 first: it may be had back from the saved uid without a
		// capability, and the rest needs root's.
		if setres(syscall.SYS_SETRESUID, 0) != nil {
			return false
		}
		caps := saved
		if unix.Capset(&hdr, &caps[0]) != nil || setres(syscall.SYS_SETRESGID, 0) != nil || setGroups(groups) != nil {
			return false
		}
		euid, _, _ := syscall.RawSyscall(syscall.SYS_GETEUID, 0, 0, 0)
		return euid == 0
	}
	dropped := saved
	for _, c := range fsCaps {
		dropped[c/32].Effective &^= 1 << (c % 32)
	}
	// Groups and gid while the thread still may set them, the uid last.
	if err := setGroups([]uint32{uint32(id.gid)}); err != nil {
		return nil, err
	}
	if err := setres(syscall.SYS_SETRESGID, id.gid); err != nil {
		return nil, err
	}
	if err := unix.Capset(&hdr, &dropped[0]); err != nil {
		return nil, err
	}
	if err := setres(syscall.SYS_SETRESUID, id.uid); err != nil {
		return nil, err
	}
	if euid, _, _ := syscall.RawSyscall(syscall.SYS_GETEUID, 0, 0, 0); int(euid) != id.uid {
		return nil, errors.New("the thread's uid did not change")
	}
	return restore, nil
}

// setres sets the calling thread's effective uid or gid (trap
// SYS_SETRESUID or SYS_SETRESGID), leaving the real and saved ones.
func setres(trap uintptr, v int) error {
	keep := ^uintptr(0) // -1: unchanged
	if _, _, errno := syscall.RawSyscall(trap, keep, uintptr(v), keep); errno != 0 {
		return errno
	}
	return nil
}

// setGroups sets the calling thread's supplementary groups only (the raw
// syscall; libc's and Go's set every thread's).
func setGroups(g []uint32) error {
	var p unsafe.Pointer
	if len(g) > 0 {
		p = unsafe.Pointer(&g[0])
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETGROUPS, uintptr(len(g)), uintptr(p), 0); errno != 0 {
		return errno
	}
	return nil
}
