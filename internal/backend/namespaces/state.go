package namespaces

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"golang.org/x/sys/unix"
)

// Each running sandbox holds an exclusive flock on <state dir>/runs/<id>.
// The kernel drops the lock when its holder dies, however it dies, so a
// cgroup whose lock can be taken belongs to nobody and may be removed.

type runLock struct {
	path string
	f    *os.File
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

// lockRun creates the locked file of sandbox id. The file is locked under a
// temporary name and then renamed, so that under its final name it is
// never seen unlocked while its owner lives.
func (b *Backend) lockRun(id string) (*runLock, error) {
	dir := filepath.Join(b.stateDir, "runs")
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

// release unlocks; remove says whether the sandbox is entirely gone, so
// that its lock file can go too.
func (l *runLock) release(remove bool) {
	if remove {
		os.Remove(l.path)
	}
	l.f.Close()
}

// Cleanup removes what sandboxes of earlier, killed airlock processes left
// behind: their processes, cgroups and lock files. A sandbox's lock file
// exists before its cgroup and is removed after it, so every leftover
// cgroup has a lock file that nobody holds; live sandboxes, whose owners
// hold their locks, are not touched.
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
			// A temporary name is a lock being created: locking it would
			// make its owner fail. Only an old one is a crash's leftover.
			if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
				continue
			}
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			continue // removed by its owner meanwhile
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close() // held: a live sandbox
			continue
		}
		// A temporary name (".new-…") never had a cgroup.
		if !strings.HasPrefix(e.Name(), ".") {
			cg := cgroups.Load(cgroups.Prefix + e.Name())
			if err := cg.Kill(); err != nil {
				errs = append(errs, fmt.Errorf("kill leftover sandbox %s: %w", e.Name(), err))
				f.Close()
				continue
			}
			if err := cg.Destroy(); err != nil {
				errs = append(errs, fmt.Errorf("remove leftover cgroup %s: %w", e.Name(), err))
				f.Close()
				continue
			}
		}
		os.Remove(filepath.Join(b.stateDir, "agents", e.Name()+".sock"))
		os.Remove(p)
		f.Close()
	}
	return errors.Join(errs...)
}
