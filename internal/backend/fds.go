package backend

import (
	"os"

	"golang.org/x/sys/unix"
)

// RawFd is f's descriptor, valid while f is open, for handing it over
// (SCM_RIGHTS). Unlike f.Fd it leaves f as it is: Fd puts a pipe in
// blocking mode (its open file description's, which every copy shares),
// and a goroutine reading it then holds a thread of its own, one per
// sandbox. -1 if f has none.
func RawFd(f *os.File) int {
	fd := -1
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}

// Pollable is f, a pipe handed over, as a file Go's poller reads: one in
// blocking mode would hold a thread while read. f is closed if a new
// file replaces it.
func Pollable(f *os.File) *os.File {
	fd := RawFd(f)
	if fd < 0 || unix.SetNonblock(fd, true) != nil {
		return f
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return f
	}
	f.Close()
	return os.NewFile(uintptr(dup), f.Name())
}
