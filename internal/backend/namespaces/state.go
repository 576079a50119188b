package namespaces

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/rangelock"
	"golang.org/x/sys/unix"
)

// Each sandbox has a record, <state dir>/runs/<id>, and holds a lock on
// one byte of <state dir>/runs.lock, at the offset its id hashes to, for
// as long as it lives (rangelock.Locks: the kernel drops it when its holder
// dies, however it dies). The lock is taken before the record is made,
// and the record removed after the sandbox's cgroup: a record whose lock
// can be taken belongs to nobody, and its cgroup may be removed.
const runsLockFile = "runs.lock"

type runLock struct {
	locks *rangelock.Locks
	path  string
	off   int64
}

// runOffset is where sandbox id's lock is. Ids are random and never
// reused; two live sandboxes meet at one offset with a probability of
// about n²/2^63, and then the second fails to start (rangelock.ErrBusy): a lock is
// never shared.
func runOffset(id string) int64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return int64(h.Sum64() >> 2) // positive, and Start+Len cannot overflow
}

func (b *Backend) prepareStateDir() error {
	if err := os.MkdirAll(filepath.Join(b.stateDir, "runs"), 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	// 0755: init, an unprivileged host uid, walks to it.
	if err := os.MkdirAll(RootMountDir, 0o755); err != nil {
		return fmt.Errorf("sandbox mount point: %w", err)
	}
	return nil
}

// lockRun locks sandbox id's byte of runs.lock, then creates its record.
func (b *Backend) lockRun(id string) (*runLock, error) {
	off := runOffset(id)
	if err := b.runs.TryLock(off); err != nil {
		return nil, fmt.Errorf("lock sandbox %s: %w", id, err)
	}
	p := filepath.Join(b.stateDir, "runs", id)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		b.runs.Unlock(off)
		return nil, fmt.Errorf("lock sandbox %s: %w", id, err)
	}
	f.Close()
	return &runLock{locks: b.runs, path: p, off: off}, nil
}

// release unlocks; remove says whether the sandbox is entirely gone, so
// that its record can go too.
func (l *runLock) release(remove bool) {
	if remove {
		os.Remove(l.path)
	}
	l.locks.Unlock(l.off)
}

// heldByFlock reports whether an older airlock, which flocked each
// sandbox's record itself, holds the record at p: its sandbox lives.
func heldByFlock(p string) bool {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
}

// Cleanup removes what sandboxes of earlier, killed airlock processes left
// behind: their processes, cgroups and records. A sandbox's record exists
// before its cgroup and is removed after it, so every leftover cgroup has
// a record whose lock nobody holds; live sandboxes, whose owners hold
// their locks, are not touched.
func (b *Backend) Cleanup(context.Context) error {
	if os.Geteuid() != 0 {
		return nil // nothing of ours can exist without root
	}
	dir := filepath.Join(b.stateDir, "runs")
	entries, _ := os.ReadDir(dir) // none: nothing ran with this state directory
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			// An older airlock made a record under a temporary name, and
			// then its cgroup. Only an old one nobody holds is a leftover.
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) >= time.Minute && !heldByFlock(p) {
				os.Remove(p)
			}
			continue
		}
		off := runOffset(e.Name())
		if b.runs.TryLock(off) != nil {
			continue // held: a live sandbox (or none can tell: leave it)
		}
		if heldByFlock(p) {
			b.runs.Unlock(off)
			continue
		}
		cg := cgroups.Load(cgroups.Prefix + e.Name())
		if err := cg.Kill(); err != nil {
			errs = append(errs, fmt.Errorf("kill leftover sandbox %s: %w", e.Name(), err))
		} else if err := cg.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("remove leftover cgroup %s: %w", e.Name(), err))
		} else {
			os.Remove(filepath.Join(b.stateDir, "agents", e.Name()+".sock"))
			os.Remove(p)
		}
		b.runs.Unlock(off)
	}
	return errors.Join(errs...)
}
