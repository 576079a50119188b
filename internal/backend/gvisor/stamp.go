package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/backend"
)

// Saved state (a checkpoint, a snapshot) is stamped when it is made and
// checked before runsc is given it. runsc restores only what the same
// build of runsc saved: the Sentry's objects are written as they are in
// memory, so another build may decode them into nonsense. No version
// says which build ran (runsc built with go install reports
// VERSION_MISSING), so the stamp names runsc by the hash of its binary.
// It also lists every file of the state with its size: a truncated or
// missing file is refused here, before runsc reads a byte of it.
//
//	airlock gvisor state 1
//	runsc sha256:<hex>
//	file <name> <size>
//	...
const (
	stampFile   = "airlock-stamp"
	stampFormat = "airlock gvisor state 1"
)

// runscStamp is the line that names the backend's runsc.
func (be *Backend) runscStamp() (string, error) {
	be.stampOnce.Do(func() {
		f, err := os.Open(be.runsc)
		if err != nil {
			be.stampErr = err
			return
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			be.stampErr = err
			return
		}
		be.stamp = "runsc sha256:" + hex.EncodeToString(h.Sum(nil))
	})
	return be.stamp, be.stampErr
}

// stampLines is the stamp dir would have if this backend's runsc had
// just saved it.
func (be *Backend) stampLines(dir string) ([]string, error) {
	runsc, err := be.runscStamp()
	if err != nil {
		return nil, err
	}
	lines := []string{stampFormat, runsc}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Name() == stampFile {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() || strings.ContainsAny(e.Name(), " \n") {
			return nil, fmt.Errorf("%s is not a file of saved state", e.Name())
		}
		lines = append(lines, fmt.Sprintf("file %s %d", e.Name(), fi.Size()))
	}
	return lines, nil
}

// writeStamp stamps the state runsc has just saved in dir.
func (be *Backend) writeStamp(dir string) error {
	lines, err := be.stampLines(dir)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, stampFile), []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// checkStamp refuses the state in dir (a *backend.StateError) unless this
// backend's runsc saved it and it is whole.
func (be *Backend) checkStamp(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, stampFile))
	if errors.Is(err, fs.ErrNotExist) {
		return &backend.StateError{Reason: "is incomplete or not Airlock's: it has no stamp"}
	}
	if err != nil {
		return err
	}
	got := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	want, err := be.stampLines(dir)
	if err != nil {
		return err
	}
	switch {
	case got[0] != stampFormat:
		return &backend.StateError{Reason: "is of a format this server does not know"}
	case len(got) < 2 || got[1] != want[1]:
		return &backend.StateError{Reason: "was saved by another build of runsc than this server's, and runsc restores only its own"}
	case !slices.Equal(got, want):
		return &backend.StateError{Reason: "is corrupt: its files are not those that were saved"}
	}
	return nil
}
