// Package clusterbin carries the cluster binary (cmd/airlock-cluster:
// airlock router, and a node's registration with the Kubernetes API
// server), which make builds and airlock embeds, and starts it.
//
// It is kept out of airlock's own binary as the sandbox binary is
// (internal/sandboxbin): Kubernetes' client packages cost every process
// that links them about 2 ms and 230 page faults at start (their init
// functions), and airlock run, a one-shot that never needs them, is
// measured against bubblewrap.
package clusterbin

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

//go:embed bin
var embedded embed.FS

const binPath = "bin/airlock-cluster"

// binary is the cluster binary, read once from src: what make embedded,
// or a test's files.
type binary struct {
	src  fs.FS
	once sync.Once
	file *os.File
	err  error
}

var cluster = &binary{src: embedded}

// load puts the binary in an anonymous memory file (memfd), sealed
// against writes: nothing is written to disk, so a read-only root file
// system (the router's pod) does, and nothing can change what runs.
func (b *binary) load() (*os.File, error) {
	b.once.Do(func() {
		data, rerr := fs.ReadFile(b.src, binPath)
		if rerr != nil || len(data) == 0 {
			b.err = errors.New("this airlock was built without its cluster binary: build it with make build")
			return
		}
		fd, merr := unix.MemfdCreate("airlock-cluster", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if merr != nil {
			b.err = fmt.Errorf("cluster binary: memfd: %w", merr)
			return
		}
		f := os.NewFile(uintptr(fd), "airlock-cluster")
		if _, werr := f.Write(data); werr != nil {
			f.Close()
			b.err = fmt.Errorf("cluster binary: %w", werr)
			return
		}
		seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
		if _, serr := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); serr != nil {
			f.Close()
			b.err = fmt.Errorf("cluster binary: seal: %w", serr)
			return
		}
		b.file = f
	})
	return b.file, b.err
}

// path is how a process started from this one names the binary: its
// own copy of the descriptor, before exec closes it.
func path(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// Command is the cluster binary with args, to be started.
func Command(args ...string) (*exec.Cmd, error) { return cluster.command(args...) }

func (b *binary) command(args ...string) (*exec.Cmd, error) {
	f, err := b.load()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path(f), args...)
	cmd.Args[0] = "airlock-cluster"
	return cmd, nil
}

// Exec replaces this process with the cluster binary and args.
func Exec(args ...string) error {
	f, err := cluster.load()
	if err != nil {
		return err
	}
	return syscall.Exec(path(f), append([]string{"airlock-cluster"}, args...), os.Environ())
}
