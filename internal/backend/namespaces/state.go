package namespaces

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Each running sandbox holds an exclusive flock on StateDir/runs/<id>.
// The kernel drops the lock when its holder dies, however it dies, so a
// cgroup whose lock can be taken belongs to nobody and may be removed.

type runLock struct {
	path string
	f    *os.File
}

func prepareStateDir() error {
	// 0755: the sandbox's init runs as an unprivileged host uid and must be
	// able to walk to root/, the (empty) directory it mounts its root on.
	for _, d := range []string{StateDir, filepath.Join(StateDir, "root"), filepath.Join(StateDir, "runs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
	}
	return nil
}

// lockRun creates the locked file of sandbox id. The file is locked under a
// temporary name and then renamed, so that under its final name it is
// never seen unlocked while its owner lives.
func lockRun(id string) (*runLock, error) {
	dir := filepath.Join(StateDir, "runs")
	tmp, err := os.CreateTemp(dir, ".new-")
	if err != nil {
		return nil, fmt.Errorf("lock sandbox %s: %w", id, err)
	}
	p := filepath.Join(dir, id)
	if err = unix.Flock(int(tmp.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("lock sandbox %s: %w", id, err)
	}
	return &runLock{path: p, f: tmp}, nil
}

func (l *runLock) release() {
	os.Remove(l.path)
	l.f.Close()
}

// Cleanup removes what sandboxes of earlier, killed airlock processes left
// behind: their processes, cgroups and lock files. Live sandboxes, whose
// owners still hold their locks, are not touched.
func Cleanup() error {
	if os.Geteuid() != 0 {
		return nil // nothing of ours can exist without root
	}
	var errs []error
	for _, id := range leftoverCgroupIDs() {
		p := filepath.Join(StateDir, "runs", id)
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err == nil {
			if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
				f.Close() // held: a live sandbox
				continue
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		// Owner is gone, or the lock file was never written (the cgroup is
		// created after it, so a missing file means a crashed cleanup).
		cg := loadCgroup(id)
		if err := cg.kill(); err != nil {
			errs = append(errs, fmt.Errorf("kill leftover sandbox %s: %w", id, err))
		} else if err := cg.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("remove leftover cgroup %s: %w", id, err))
		}
		os.Remove(p)
		if f != nil {
			f.Close()
		}
	}
	// Any other lock file that can be taken is a dead owner's; its cgroup,
	// if it had one, was handled above.
	entries, _ := os.ReadDir(filepath.Join(StateDir, "runs"))
	for _, e := range entries {
		p := filepath.Join(StateDir, "runs", e.Name())
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			os.Remove(p)
		}
		f.Close()
	}
	return errors.Join(errs...)
}
