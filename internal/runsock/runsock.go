// Package runsock is airlock run's way into a local airlock serve: a Unix
// socket in the daemon's state directory through which the command runs
// in a sandbox the daemon's pool has ready, rather than in one built for
// it. The daemon answers only root (the socket's peer credentials), as
// airlock run's direct path needs root too.
//
// The protocol is agentproto's frames. The client sends a FrameRequest
// with a Request; the daemon answers FrameDirect (it will not: run it
// directly; nothing ran) or FrameClaimed; the client then sends FrameGo,
// and only then does the command start, so that a client that gave up
// waiting runs it directly without running it twice. Then the daemon
// sends the command's output (agentproto.FrameStdout, FrameStderr) and
// its FrameResult, and the client its stdin (agentproto.FrameStdin,
// FrameStdinEnd). A client that closes the connection has the sandbox
// killed.
package runsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// SocketName is the socket's name in the state directory; LockName the
// file whose flock the daemon that serves it holds.
const (
	SocketName = "run.sock"
	LockName   = "run.lock"
)

// Version is the protocol's; a daemon that speaks another answers
// FrameDirect.
const Version = 1

// Frames of this protocol beside agentproto's.
const (
	FrameDirect  byte = 'D' // why, as text
	FrameClaimed byte = 'C'
	FrameGo      byte = 'G'
	FrameResult  byte = 'T' // a Result, as JSON
)

// Request is a command as airlock run would run it directly.
type Request struct {
	V       int      `json:"v"`
	Backend string   `json:"backend"`
	Argv    []string `json:"argv"`
	Env     []string `json:"env"`
	Cwd     string   `json:"cwd"`
	Umask   uint32   `json:"umask"`
	Stdin   bool     `json:"stdin"`
	// The limits: a sandbox of the pool has its template's, and is used
	// only where they are these.
	MemoryBytes int64   `json:"memoryBytes"`
	Pids        int64   `json:"pids"`
	CPUs        float64 `json:"cpus"`
	DiskBytes   int64   `json:"diskBytes"`
	// Timeout and OutputLimit are the daemon's to keep, as the direct
	// path's host side keeps them.
	Timeout     time.Duration `json:"timeout"`
	OutputLimit int64         `json:"outputLimit"`
	// Network is what the command may reach, through the daemon's
	// network for sandboxes (its resolver, its limits).
	Network policy.Network `json:"network"`
	// Files are the code files of --file and --code, for layout.CodeDir.
	Files []backend.File `json:"files"`
}

// MaxRequest bounds a request's frame: a code file is at most 16 MiB, in
// base64.
const MaxRequest = 24 << 20

// Result is how the command ended, or, with SetupError, that it could
// not start (nothing ran).
type Result struct {
	backend.Result
	SetupError string `json:"setupError,omitempty"`
}

// Addr is the address of the socket in dir. A path too long for a socket
// address (108 bytes) is reached through dir's descriptor, which the
// returned release closes once the socket is bound or connected.
func Addr(dir string) (addr string, release func(), err error) {
	path := filepath.Join(dir, SocketName)
	if len(path) < len(unix.RawSockaddrUnix{}.Path) {
		return path, func() {}, nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, SocketName), func() { unix.Close(fd) }, nil
}

// ErrNoDaemon: no daemon serves the socket (none runs, or an older one
// that has none).
var ErrNoDaemon = errors.New("no airlock serve answers in the state directory")

// Dial connects to the daemon of the state directory dir.
func Dial(dir string) (*net.UnixConn, error) {
	addr, release, err := Addr(dir)
	if err != nil {
		return nil, err
	}
	defer release()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: addr, Net: "unix"})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOTDIR) {
		return nil, ErrNoDaemon
	}
	return c, err
}

// PeerIsRoot reports whether the process at the other end of c runs as
// root, as the kernel saw it when it connected (for a client) or bound
// the socket (for a server).
func PeerIsRoot(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return false
	}
	return cred.Uid == 0
}
