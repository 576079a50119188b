// Package gvisor runs sandboxes under gVisor's user-space kernel (runsc):
// untrusted code talks to gVisor's Sentry, not to the host kernel.
package gvisor

import (
	"debug/elf"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/backend"
)

// Backend builds sandboxes with runsc. Its state directory holds runsc's
// state, the OCI bundles, one lock file per running sandbox and the
// agents' sockets; only host root uses it.
type Backend struct {
	runsc    string
	stateDir string
	log      *slog.Logger

	stampOnce sync.Once
	stamp     string // what saved state is marked with (checkpoint.go)
	stampErr  error

	// keeper holds the sandboxes an earlier process left running (and,
	// if keepAlive, starts runsc for this one's): adopt.go.
	keeper    backend.Keeper
	keepAlive bool

	// trust is the egress CA that sandboxes with a network trust
	// (TrustCA): in the copy of the host's /etc (etc.go), or added to an
	// image's store (image.go).
	trust []byte
}

var _ backend.Backend = (*Backend)(nil)

// DefaultStateDir is the state directory of airlock run, which has no
// daemon's state directory to use.
const DefaultStateDir = "/run/airlock-gvisor"

// New returns the backend running runsc (see FindRunsc), keeping its state
// in stateDir; agents' logs go to log.
func New(runsc, stateDir string, log *slog.Logger) *Backend {
	return &Backend{runsc: runsc, stateDir: stateDir, log: log}
}

// TrustCA has every sandbox with a network trust the CA of pem from now
// on, beside the roots of its system's store (layout.CABundle).
func (b *Backend) TrustCA(pem []byte) error {
	b.trust = pem
	return nil
}

// trustOf is what a sandbox (networked or not) trusts beyond its roots.
func (b *Backend) trustOf(networked bool) []byte {
	if !networked {
		return nil
	}
	return b.trust
}

// Name is "gvisor".
func (b *Backend) Name() string { return "gvisor" }

// Runsc is the runsc binary the backend runs.
func (b *Backend) Runsc() string { return b.runsc }

// ErrNotRoot: runsc builds sandboxes as host root.
var ErrNotRoot = errors.New("the gvisor backend needs root (runsc runs as root)")

// Check reports whether spec can run, without starting anything.
func (b *Backend) Check(spec *backend.Spec) error {
	if err := backend.CheckSpec(spec); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	return nil
}

// idleHostTasks is how many host tasks an idle gVisor sandbox uses: the
// Sentry's threads and the gofer's (see newBundle).
const idleHostTasks = 32

// FindRunsc returns the runsc to use: path if given, else $AIRLOCK_RUNSC,
// else runsc on PATH. It must be statically linked: a dynamically linked
// runsc fails after its pivot_root ("fork/exec /proc/self/exe: no such
// file or directory").
func FindRunsc(path string) (string, error) {
	if path == "" {
		path = os.Getenv("AIRLOCK_RUNSC")
	}
	if path == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return "", errors.New("runsc not found: build it (make runsc) or pass --runsc PATH")
		}
		path = p
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("runsc at %s is not an executable: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("runsc at %s is dynamically linked: build it with CGO_ENABLED=0", path)
		}
	}
	return path, nil
}
