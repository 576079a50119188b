package rangelock

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// heldElsewhere reports whether another open description sees byte off
// of path locked: what another process, or another Locks, would.
func heldElsewhere(t *testing.T, path string, off int64) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: io.SeekStart, Start: off, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		t.Fatal(err)
	}
	return lk.Type != unix.F_UNLCK
}

func TestLocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks")
	l := &Locks{Path: path}
	if err := l.TryLock(7); err != nil {
		t.Fatal(err)
	}
	if err := l.TryLock(7); !errors.Is(err, ErrBusy) {
		t.Errorf("a byte taken twice by one process: %v, want ErrBusy", err)
	}
	if err := l.TryLock(8); err != nil {
		t.Fatalf("the next byte: %v", err)
	}
	if !heldElsewhere(t, path, 7) || !heldElsewhere(t, path, 8) || heldElsewhere(t, path, 9) {
		t.Error("bytes 7 and 8 held, 9 free: not as another description sees them")
	}
	// Another description (another process's Locks) cannot take them.
	other := &Locks{Path: path}
	if err := other.TryLock(8); !errors.Is(err, ErrBusy) {
		t.Errorf("a byte held through another description: %v, want ErrBusy", err)
	}
	l.Unlock(7)
	if heldElsewhere(t, path, 7) || !heldElsewhere(t, path, 8) {
		t.Error("Unlock(7) did not free 7 alone")
	}
	if err := other.TryLock(7); err != nil {
		t.Errorf("a byte freed: %v", err)
	}
	// A hundred locks, one descriptor.
	fds := func() int {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}
	before := fds()
	many := &Locks{Path: path}
	for off := int64(100); off < 200; off++ {
		if err := many.TryLock(off); err != nil {
			t.Fatal(err)
		}
	}
	if n := fds() - before; n > 1 {
		t.Errorf("100 locks took %d descriptors", n)
	}
}

// A description handed to another holder (a keeper, then the next
// daemon) keeps its locks held while the first holder is gone, and the
// adopter takes them as its own: TryLock succeeds on them, and Unlock
// frees them for everyone.
func TestAdopt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks")
	first := &Locks{Path: path}
	if err := first.TryLock(3); err != nil {
		t.Fatal(err)
	}
	f, err := first.File()
	if err != nil {
		t.Fatal(err)
	}
	// The first holder goes; a duplicate of its description is what the
	// keeper kept.
	kept, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !heldElsewhere(t, path, 3) {
		t.Fatal("the lock went with its first holder's descriptor")
	}
	next := &Locks{Path: path}
	if err := next.Adopt(os.NewFile(uintptr(kept), path)); err != nil {
		t.Fatal(err)
	}
	if err := next.TryLock(3); err != nil {
		t.Fatalf("the adopted lock: %v", err)
	}
	if err := (&Locks{Path: path}).TryLock(3); !errors.Is(err, ErrBusy) {
		t.Errorf("another description took an adopted lock: %v", err)
	}
	next.Unlock(3)
	if heldElsewhere(t, path, 3) {
		t.Error("an adopted lock, released, is still held")
	}
	again, err := unix.FcntlInt(uintptr(kept), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Adopt(os.NewFile(uintptr(again), path)); err != nil {
		t.Errorf("the description adopted already, offered again: %v", err)
	}
	fresh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Adopt(fresh); err == nil {
		t.Error("a second description adopted by one holder")
	}
	other, err := os.Create(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := (&Locks{Path: path}).Adopt(other); err == nil {
		t.Error("a description of another file adopted")
	}
}
