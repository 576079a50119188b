package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/gvisor"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/rangelock"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// backends makes each backend once, when first asked for, with its state
// below the daemon's state directory; or holds the ones Options gave.
type backends struct {
	// names are the backends there are; the first is the default.
	names []string
	make  func(name string) (sandbox.Backend, error)
	// host: the host's own backends (namespaces, gVisor), which need root
	// and whose dead sandboxes' cgroups are the daemon's to sweep.
	host bool
	m    map[string]sandbox.Backend // made so far
	// trust is the egress CA the host's backends' networked sandboxes
	// trust (egress.go), set before the first is made.
	trust []byte
}

func newBackends(stateDir, runsc string, given map[string]sandbox.Backend, log *slog.Logger) *backends {
	if given != nil {
		return &backends{names: slices.Sorted(maps.Keys(given)), m: map[string]sandbox.Backend{},
			make: func(name string) (sandbox.Backend, error) { return given[name], nil }}
	}
	bs := &backends{names: []string{"namespaces", "gvisor"}, host: true, m: map[string]sandbox.Backend{}}
	bs.make = func(name string) (sandbox.Backend, error) {
		if name == "namespaces" {
			return namespaces.New(filepath.Join(stateDir, "run"), log), nil
		}
		// gvisor needs runsc, found from the configured path,
		// $AIRLOCK_RUNSC or PATH.
		path, err := gvisor.FindRunsc(runsc)
		if err != nil {
			return nil, err
		}
		return gvisor.New(path, filepath.Join(stateDir, "gvisor"), log), nil
	}
	return bs
}

// get returns the backend called name ("" is the default, namespaces).
func (bs *backends) get(name string) (sandbox.Backend, error) {
	if name == "" {
		name = bs.names[0]
	}
	if b, ok := bs.m[name]; ok {
		return b, nil
	}
	if !slices.Contains(bs.names, name) {
		return nil, fmt.Errorf("unknown backend %q (%s)", name, strings.Join(bs.names, " or "))
	}
	b, err := bs.make(name)
	if err != nil {
		return nil, err
	}
	if err := bs.trustIn(b); err != nil {
		return nil, err
	}
	bs.m[name] = b
	return b, nil
}

// trustCA has the networked sandboxes of every host backend, made or
// yet to be, trust the egress CA of pem.
func (bs *backends) trustCA(pem []byte) error {
	bs.trust = pem
	for _, b := range bs.m {
		if err := bs.trustIn(b); err != nil {
			return err
		}
	}
	return nil
}

func (bs *backends) trustIn(b sandbox.Backend) error {
	if t, ok := b.(interface{ TrustCA([]byte) error }); ok && bs.host && bs.trust != nil {
		return t.TrustCA(bs.trust)
	}
	return nil
}

// keep has the namespaces backend take back what the sandboxes an
// earlier daemon left running hold (Reattach), with locks beyond its
// own, and, if live, keep this daemon's sandboxes alive past it. What
// cannot be taken back is an error: its sandboxes would look like
// leftovers to the cleanups that follow.
func (bs *backends) keep(live bool, locks ...*rangelock.Locks) error {
	if !bs.host {
		return nil
	}
	b, err := bs.get("namespaces")
	if err != nil {
		return nil
	}
	nb := b.(*namespaces.Backend)
	if live {
		nb.KeepAlive(locks...)
	}
	if err := nb.Reattach(locks...); err != nil {
		return fmt.Errorf("the sandboxes an earlier daemon left running: %w", err)
	}
	// gVisor's runsc is kept by the same keeper, where runsc is found.
	if g, err := bs.get("gvisor"); err == nil {
		g.(*gvisor.Backend).SetKeeper(nb, live)
		return nil
	}
	// No runsc here now: its kept sandboxes cannot be taken back, and
	// end (their bundles go at the next start that finds runsc).
	for _, tag := range nb.KeptTags("gvisor/") {
		if p, _, files := nb.TakeKept(tag); p != nil {
			p.Signal(syscall.SIGKILL)
			p.Wait()
			for _, f := range files {
				f.Close()
			}
		}
	}
	return nil
}

// sweep removes the cgroups that sandboxes of dead processes left, older
// than any sandbox takes between making its cgroup and starting.
func (bs *backends) sweep() {
	if bs.host {
		cgroups.SweepOrphans(2 * backend.SetupTimeout)
	}
}

// checkStateDir refuses, before anything is started, what would make the
// state directory unusable.
func (bs *backends) checkStateDir(dir string) error {
	if bs.host && os.Geteuid() != 0 {
		return configError(namespaces.ErrNotRoot)
	}
	if !filepath.IsAbs(dir) {
		return configErrorf("state directory %q is not an absolute path", dir)
	}
	return nil
}

// openStateDir makes the state directory and removes what processes that
// died left in it (with runsc, their gVisor sandboxes too). Several
// daemons and airlock mcp processes may share it: cleanup touches only
// sandboxes whose owner is gone.
func openStateDir(ctx context.Context, dir string, backends *backends, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	// It holds the API key, sandboxes' tokens and saved memory: one that
	// another user owns is refused; one that others may enter (mkdir's
	// 0755) is closed to them before anything is written in it.
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("state directory %s must be owned by the user airlock runs as", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("state directory: %w", err)
		}
		log.Warn("the state directory was open to others: made 0700", "dir", dir, "was", fmt.Sprintf("%04o", perm))
	}
	// Namespaces sandboxes need nothing but root to clean up after, so
	// that is done whichever backend this process uses.
	if _, err := backends.get(""); err != nil {
		return err
	}
	for _, b := range backends.m {
		if err := b.Cleanup(ctx); err != nil {
			log.Warn("cleanup of an earlier run", "backend", b.Name(), "err", err)
		}
	}
	return nil
}
