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
