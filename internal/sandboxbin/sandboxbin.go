// Package sandboxbin carries the sandbox binary (cmd/airlock-sandbox: a
// sandbox's init, its agent and sudo), which make builds and airlock
// embeds, and installs it where sandboxes can run it.
//
// What runs inside a sandbox is kept out of the daemon's binary: a
// process started in every sandbox pays, at every start, for the
// packages its binary carries (their init functions, the pages the Go
// runtime touches), and the daemon's carry registries, MCP and
// netlink that no sandbox needs.
package sandboxbin

import (
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

//go:embed bin
var embedded embed.FS

// source is where Install reads the binary and its hash: what make
// embedded, or a test's files.
var source fs.FS = embedded

const (
	name     = "airlock-sandbox"
	binPath  = "bin/" + name
	hashPath = binPath + ".sha256"
)

// Binary is the sandbox binary installed in a directory.
type Binary struct {
	// Path is the file, for those that open it by name as root (a bind
	// mount's source).
	Path string
	// File is an O_PATH descriptor of it: a process that can no longer
	// reach Path (an unprivileged uid, another mount namespace) executes
	// it as /proc/self/fd/N.
	File *os.File
}

var (
	mu        sync.Mutex
	installed = map[string]*Binary{}
)

// Install returns the sandbox binary in dir, writing it there first if it
// is missing: a file named by its hash, owned by root, mode 0555, which no
// sandbox's uid can change. Other versions left there are removed (a
// process still running one keeps its copy). The result is kept for the
// life of the process.
func Install(dir string) (*Binary, error) {
	mu.Lock()
	defer mu.Unlock()
	if b := installed[dir]; b != nil {
		return b, nil
	}
	sum, err := fs.ReadFile(source, hashPath)
	if err != nil {
		return nil, errors.New("this airlock was built without its sandbox binary: build it with make build")
	}
	fi, err := fs.Stat(source, binPath)
	if err != nil {
		return nil, errors.New("this airlock was built without its sandbox binary: build it with make build")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox binary: %w", err)
	}
	id := strings.TrimSpace(string(sum))
	if len(id) < 16 {
		return nil, fmt.Errorf("the sandbox binary's hash %q is malformed", id)
	}
	path := filepath.Join(dir, name+"-"+id[:16])
	f, err := openInstalled(path, fi.Size())
	if errors.Is(err, os.ErrNotExist) {
		if err = write(dir, path); err == nil {
			f, err = openInstalled(path, fi.Size())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox binary: %w", err)
	}
	removeOthers(dir, path)
	b := &Binary{Path: path, File: f}
	installed[dir] = b
	return b, nil
}

// openInstalled opens path if it is the sandbox binary as Install leaves
// it: a regular file of root's, of the embedded size, that only root can
// have written. Anything else there is an error, not replaced: only root
// writes the directory.
func openInstalled(path string, size int64) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Mode&0o7777 != 0o555 || st.Size != size {
		f.Close()
		return nil, fmt.Errorf("%s is not the sandbox binary airlock installs (owner, mode or size differ): remove it", path)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err == nil && sfs.Flags&unix.ST_NOEXEC != 0 {
		f.Close()
		return nil, fmt.Errorf("%s is on a file system mounted noexec: use a state directory elsewhere", filepath.Dir(path))
	}
	return f, nil
}

// write puts the embedded binary at path: written whole under a temporary
// name, then renamed, so that no process ever sees part of it.
func write(dir, path string) error {
	src, err := source.Open(binPath)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, src)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// removeOthers removes the other versions of the sandbox binary in dir,
// and temporary files a crash left (older than a minute: a younger one
// may be another process's install under way).
func removeOthers(dir, keep string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		n, p := e.Name(), filepath.Join(dir, e.Name())
		switch {
		case strings.HasPrefix(n, name+"-") && p != keep:
			os.Remove(p)
		case strings.HasPrefix(n, "."+name+"-"):
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
				os.Remove(p)
			}
		}
	}
}
