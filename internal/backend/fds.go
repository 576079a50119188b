package backend

import (
	"crypto/rand"
	"encoding/hex"
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

// NewBoxID is a new box's id on the host: 16 random lower-case hex
// digits, which name its cgroup (cgroups.Prefix), its records, sockets
// and bundle in the backend's state directory.
func NewBoxID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// IsBoxID reports whether id is one NewBoxID makes: what a backend checks
// of an id handed over (by a keeper) before it makes a path of it.
func IsBoxID(id string) bool {
	if len(id) != 16 {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// CloseAll closes files.
func CloseAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
