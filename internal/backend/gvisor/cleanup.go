package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/cgroups"
)

// Cleanup removes the gVisor sandboxes of earlier, killed airlock runs:
// bundles whose lock nobody holds, with their runsc state and cgroups.
func (be *Backend) Cleanup(context.Context) error {
	var errs []error
	entries, _ := os.ReadDir(filepath.Join(be.stateDir, "bundles"))
	for _, e := range entries {
		b := &bundle{id: e.Name(), dir: filepath.Join(be.stateDir, "bundles", e.Name()), stateDir: be.stateDir, cg: cgroups.Load(cgroups.Prefix + e.Name())}
		// The bundle's lock, or the one it is made under before it gets
		// its name (openBundle): held, its owner lives; free, it died,
		// even while making the bundle. (Taken in the instant between
		// another process's creating lock.new and locking it, that
		// process's rename fails and its start with it: nothing leaks.)
		f, err := os.OpenFile(filepath.Join(b.dir, "lock"), os.O_RDWR, 0)
		if err != nil {
			f, err = os.OpenFile(filepath.Join(b.dir, "lock.new"), os.O_RDWR, 0)
		}
		if err == nil {
			if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil || replaced(f, b.dir) {
				f.Close()
				continue // alive
			}
			b.lock = f
		} else if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue // being created: no lock file yet
		}
		if _, err := os.Stat(filepath.Join(b.dir, savedMarker)); err == nil {
			// Saved: the manager restores or forgets it. What a restore
			// that died with its daemon had started goes (runsc's state,
			// the cgroup, the root's and agent's mounts); the saved state
			// stays, for the next restore.
			if err := b.release(be.runsc); err != nil {
				errs = append(errs, fmt.Errorf("saved gVisor sandbox %s: what a restore started: %w", b.id, err))
			}
			continue
		}
		if err := b.remove(be.runsc); err != nil {
			errs = append(errs, fmt.Errorf("leftover gVisor sandbox %s: %w", b.id, err))
		}
	}
	// Agent directories whose bundle is gone: their unmount failed when
	// it was removed. (A bundle is made before its agent directory.)
	agents, _ := os.ReadDir(filepath.Join(be.stateDir, "agents"))
	for _, e := range agents {
		if _, err := os.Lstat(filepath.Join(be.stateDir, "bundles", e.Name())); errors.Is(err, fs.ErrNotExist) {
			if err := removeAgentDir(filepath.Join(be.stateDir, "agents", e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("leftover agent directory %s: %w", e.Name(), err))
			}
		}
	}
	// Half-built copies of /etc (etcDir) whose builder died.
	partial, _ := filepath.Glob(filepath.Join(be.stateDir, "etc", ".new-*"))
	for _, dir := range partial {
		if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) > time.Minute {
			os.RemoveAll(dir)
		}
	}
	return errors.Join(errs...)
}

// replaced reports whether the lock file f, just locked, is no longer the
// bundle's: a restore of a saved bundle locks a new one and renames it
// over the old, which a Cleanup may have opened just before. That
// bundle's owner lives.
func replaced(f *os.File, dir string) bool {
	var held, now unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil {
		return true
	}
	if unix.Stat(filepath.Join(dir, "lock"), &now) != nil {
		return f.Name() != filepath.Join(dir, "lock.new") // lock.new: not renamed yet
	}
	return held.Ino != now.Ino || held.Dev != now.Dev
}
