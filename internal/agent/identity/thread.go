package identity

import (
	"errors"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The raw syscalls that make one thread act as another user. Go's own
// (syscall.Setresuid and the like) change every thread of the process,
// as POSIX wants; the kernel's change only the calling one, which is what
// lets the agent act for a user on one thread while the rest of it stays
// root. Not setfsuid: gVisor does not implement it.

// fsCaps are the capabilities that override file permissions (the
// kernel's CAP_FS_MASK).
var fsCaps = []uint{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER,
	unix.CAP_FSETID, unix.CAP_MKNOD, unix.CAP_LINUX_IMMUTABLE, unix.CAP_MAC_OVERRIDE}

// ActAs makes the calling thread, which the caller has locked, id for
// file access: its effective uid, gid and groups id's (its saved uid
// stays 0, to come back), and its effective set without the capabilities
// that override file permissions. Linux drops those with the uid; gVisor
// might not, so they are dropped explicitly too. The process's own ids
// never change.
//
// It returns what undoes it, which reports whether the thread is root's
// again. On any failure the thread is left as it is: the caller abandons
// it (a locked thread whose goroutine ends goes with it).
func ActAs(id ID) (restore func() bool, err error) {
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
	if err := setGroups([]uint32{uint32(id.GID)}); err != nil {
		return nil, err
	}
	if err := setres(syscall.SYS_SETRESGID, id.GID); err != nil {
		return nil, err
	}
	if err := unix.Capset(&hdr, &dropped[0]); err != nil {
		return nil, err
	}
	if err := setres(syscall.SYS_SETRESUID, id.UID); err != nil {
		return nil, err
	}
	if euid, _, _ := syscall.RawSyscall(syscall.SYS_GETEUID, 0, 0, 0); int(euid) != id.UID {
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
