package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Prune removes the layers no image refers to, and what an unpack that
// died left. A layer in use by a sandbox is held by its mounts: removing
// its directory does not pull it from under them.
func (s *Store) Prune() error {
	// Not while an image is being made: its layers are in the store
	// before its record is (Hold).
	lock, err := s.lockFile()
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return nil // the next prune removes what this one would have
	} else if err != nil {
		return err
	}
	imgs, err := s.List()
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, img := range imgs {
		for _, id := range img.Layers {
			keep[strings.TrimPrefix(id, "sha256:")] = true
		}
		if img.Snapshot != nil {
			keep[img.Snapshot.Dir] = true
		}
	}
	var errs []error
	snaps, _ := os.ReadDir(filepath.Join(s.dir, "snapshots"))
	for _, e := range snaps {
		if !keep[e.Name()] {
			errs = append(errs, os.RemoveAll(filepath.Join(s.dir, "snapshots", e.Name())))
		}
	}
	entries, err := os.ReadDir(filepath.Join(s.dir, "layers"))
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		id := strings.TrimSuffix(n, ".size")
		if keep[id] {
			continue
		}
		if strings.HasPrefix(n, ".new-") {
			if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Hour {
				continue // an unpack may be under way
			}
		}
		if err := removeTree(filepath.Join(s.dir, "layers", n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func dirExists(d string) bool {
	fi, err := os.Lstat(d)
	return err == nil && fi.IsDir()
}

// dirSize is a stored layer's size, written beside it.
func dirSize(dir string) (int64, error) {
	if !dirExists(dir) {
		return 0, os.ErrNotExist
	}
	data, err := os.ReadFile(dir + ".size")
	if err != nil {
		return 0, err
	}
	var n int64
	_, err = fmt.Sscan(string(data), &n)
	return n, err
}
