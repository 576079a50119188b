// Package rangelock holds byte-range locks on a file, one byte each,
// through one open file description per process.
package rangelock

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrBusy: the byte is held, by another holder here or in another
// process.
var ErrBusy = errors.New("already held")

// Locks are byte-range locks on one file, each one byte long, taken
// through a single open file description for the whole process
// (F_OFD_SETLK). The kernel drops them when the process dies, however it
// dies, and they conflict with those of every other description, in this
// process or another. A range costs no descriptor: with one open file per
// sandbox, a host of a few thousand idle sandboxes ran out of the daemon's
// descriptors (a limit of 20,000 here, which root may not raise) with
// memory and tasks to spare.
type Locks struct {
	Path string // the file, created if missing

	mu   sync.Mutex
	f    *os.File // opened at the first lock, kept for the process's life
	held map[int64]bool
}

// TryLock takes the byte at off, or fails with ErrBusy if any holder, in
// this process too, has it.
func (r *Locks) TryLock(off int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held[off] {
		return ErrBusy // ours: the description does not conflict with itself
	}
	if r.f == nil {
		f, err := os.OpenFile(r.Path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		r.f, r.held = f, map[int64]bool{}
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: off, Len: 1}
	switch err := unix.FcntlFlock(r.f.Fd(), unix.F_OFD_SETLK, &lk); {
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES):
		return ErrBusy
	case err != nil:
		return fmt.Errorf("lock %s: %w", r.Path, err)
	}
	r.held[off] = true
	return nil
}

// Unlock releases the byte at off, taken by TryLock.
func (r *Locks) Unlock(off int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.held[off] {
		return
	}
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart, Start: off, Len: 1}
	if err := unix.FcntlFlock(r.f.Fd(), unix.F_OFD_SETLK, &lk); err == nil {
		delete(r.held, off)
	}
}

// File is the open description the locks are taken through, opened if
// it is not yet: what a process that must outlive this one (a daemon's
// keeper, internal/backend/namespaces) holds so that the locks do too.
func (r *Locks) File() (*os.File, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		f, err := os.OpenFile(r.Path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, err
		}
		r.f, r.held = f, map[int64]bool{}
	}
	return r.f, nil
}

// Adopt makes f, an open description of Path that an earlier process
// held its locks through, this process's: the bytes it holds stay held,
// and are this process's to take (TryLock succeeds on them, as on a free
// byte) and to release. It must come before any lock of this process:
// two descriptions of one process would conflict with each other. The
// description adopted already, offered again, is taken as it is (f is
// closed).
func (r *Locks) Adopt(f *os.File) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f != nil {
		if sameDescription(r.f, f) {
			f.Close()
			return nil
		}
		return fmt.Errorf("lock %s: this process holds locks there already", r.Path)
	}
	var got, want unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &got); err != nil {
		return fmt.Errorf("lock %s: %w", r.Path, err)
	}
	if err := unix.Stat(r.Path, &want); err != nil {
		return fmt.Errorf("lock %s: %w", r.Path, err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return fmt.Errorf("lock %s: the description handed over is of another file", r.Path)
	}
	r.f, r.held = f, map[int64]bool{}
	return nil
}

// sameDescription reports whether a and b are one open file description
// (kcmp's KCMP_FILE).
func sameDescription(a, b *os.File) bool {
	const kcmpFile = 0
	pid := uintptr(os.Getpid())
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, kcmpFile, a.Fd(), b.Fd(), 0)
	return errno == 0 && r == 0
}
