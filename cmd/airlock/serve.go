package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/gvisor"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/console"
	"github.com/airlock-sandbox/airlock/internal/httpapi"
	"github.com/airlock-sandbox/airlock/internal/httpserve"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandboxid"
)

func serveCmd(args []string) error {
	// Catch SIGTERM from the start: one that arrives while sandboxes are
	// being started must still shut down cleanly, not kill the daemon.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A log reader that goes away (a closed terminal, a parent that
	// exited) must not kill the daemon: Go exits on SIGPIPE from a write
	// to stdout or stderr unless the signal is handled. Writes then fail.
	signal.Ignore(syscall.SIGPIPE)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags := config.ServeFlags(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	cfg, err := config.Resolve(os.Getenv, flags)
	if err != nil {
		return usageError{err.Error()}
	}
	// A weak key is refused before anything starts (a stored one, once
	// the state directory is open, by config.APIKey).
	if cfg.APIKey != "" {
		if err := apikey.Check("AIRLOCK_API_KEY", cfg.APIKey); err != nil {
			return usageError{err.Error()}
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	backends := newBackends(cfg.StateDir, cfg.Runsc, log)
	isolation, err := backends.get(cfg.Backend)
	if err != nil {
		return usageError{err.Error()}
	}
	mcfg, err := config.Manager(&cfg, backends.get)
	if err != nil {
		return usageError{err.Error()}
	}
	// Checked before the state directory is touched, as the rest of
	// the configuration is.
	bcfg, buildPolicy, err := config.BuildSettings(&cfg)
	if err != nil {
		return usageError{err.Error()}
	}
	if err := checkNode(cfg.Node); err != nil {
		return err
	}
	if cfg.Node.Name != "" {
		mcfg.IDPrefix = sandboxid.NodePrefix(cfg.Node.Name)
	}
	if cfg.AllowRequestBackend {
		for _, name := range []string{"namespaces", "gvisor"} {
			if _, err := backends.get(name); err != nil {
				return usageError{fmt.Sprintf("allowRequestBackend needs every backend: %v", err)}
			}
		}
		mcfg.AllowRequestBackend, mcfg.Backends = true, backends.m
	}
	if err := checkStateDir(cfg.StateDir); err != nil {
		return err
	}
	network, err := newNetwork(&cfg, log)
	if err != nil {
		return usageError{err.Error()}
	}
	if network != nil {
		mcfg.Network = network
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return usageError{fmt.Sprintf("listen on %s: %v", cfg.Listen, errors.Unwrap(err))}
	}
	if err := openStateDir(ctx, cfg.StateDir, backends, log); err != nil {
		return err
	}
	// Every template of the image store (airlock template) is one of the
	// server's too, with base's limits.
	images, err := image.Open(filepath.Join(cfg.StateDir, "images"), image.DefaultLimits)
	if err != nil {
		return err
	}
	imagePool := 1
	if cfg.TemplatePoolSize != nil {
		imagePool = *cfg.TemplatePoolSize
	}
	for _, t := range mcfg.Templates {
		if t.Name == "base" {
			mcfg.Source = config.Images{Store: images, Base: t.Policy, PoolSize: imagePool, ReadyTimeout: time.Duration(bcfg.ReadyTimeout), Backends: backends.get}
		}
	}
	// Older than any sandbox takes between making its cgroup and starting.
	cgroups.SweepOrphans(2 * backend.SetupTimeout)
	apiKey, err := config.APIKey(cfg.APIKey, cfg.StateDir)
	if err != nil {
		return usageError{err.Error()}
	}
	key := apiKey.Value
	if mcfg.TokenKey, err = config.TokenKey(cfg.StateDir); err != nil {
		return err
	}
	m := sandbox.NewManager(mcfg, isolation, log)
	if cfg.Domain == "" {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		cfg.Domain = "localhost:" + port
	}
	api := httpapi.New(m, key, cfg.Domain, log)
	// The web console: a page that asks for the API key and calls the API.
	ui := console.Handler()
	api.HandlePublic("GET /{$}", ui)
	api.HandlePublic("GET /assets/", ui)
	// Builds run on the server's backend; with the internet only where
	// the host gives sandboxes networks.
	if network == nil || network.unavailable != nil {
		buildPolicy.Network = policy.Network{}
	}
	// Clients' pulls dial internet addresses of other hosts only, and
	// what the operator allows (checked in BuildSettings).
	pulls, _ := bcfg.Pulls()
	registries := pulls.Transport()
	files, err := build.OpenFiles(filepath.Join(cfg.StateDir, "images", "uploads"), int64(bcfg.Upload))
	if err != nil {
		return err
	}
	builds := &build.Service{
		Builder: &build.Builder{Store: images, Files: files, Host: buildHost{m, isolation}, Policy: buildPolicy,
			ReadyTimeout: time.Duration(bcfg.ReadyTimeout), Registries: registries},
		Log: log, Timeout: time.Duration(bcfg.Timeout), Parallel: bcfg.Parallel,
	}
	api.HandleTemplates(&httpapi.Templates{Builds: builds, Store: images, Files: files})
	// MCP's streamable HTTP transport: a session's sandbox lives as long
	// as the session, which ends when the client closes it or goes idle.
	mcpServer := mcp.New(m, time.Duration(cfg.DefaultTimeout), log)
	api.HandleAuthenticated("/mcp", sdk.NewStreamableHTTPHandler(
		func(*http.Request) *sdk.Server { return mcpServer },
		&sdk.StreamableHTTPOptions{SessionTimeout: time.Duration(cfg.DefaultTimeout), Logger: log}))
	url := "http://" + ln.Addr().String()
	announce(os.Stdout, isTerminal(os.Stdout), apiKey, url)
	log.Info("airlock serving", "listen", ln.Addr().String(), "state_dir", cfg.StateDir,
		"api_key", apikey.Fingerprint(key), "api_key_from", apiKey.From)

	srv, errc := httpserve.Serve(ln, api, httpserve.Limits{MaxConns: cfg.MaxConnections, IdleTimeout: time.Duration(cfg.IdleTimeout)})
	// In a cluster the node registers once it answers, and deregisters
	// before it stops answering: routers never send it what it drops.
	leave := func() {}
	if cfg.Node.Name != "" {
		offered := []string{isolation.Name()} // what a create can ask for
		if mcfg.AllowRequestBackend {
			offered = slices.Sorted(maps.Keys(backends.m))
		}
		if leave, err = joinCluster(cfg.Node, ln.Addr(), key, offered, mcfg.MaxSandboxes, log); err != nil {
			srv.Close()
			m.Shutdown()
			return err
		}
	}
	select {
	case err = <-errc:
	case <-ctx.Done():
		log.Info("shutting down")
	}
	leave()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(shutdown)
	builds.Shutdown()
	m.Shutdown()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// announce prints what an E2B client needs, as environment lines. The
// key itself only when this start generated it and stdout is a
// terminal: a key printed to a pipe or a file lands in logs (a service's
// journal, a pod's log) and outlives the screen. Otherwise a comment
// says where the key is and gives its fingerprint.
func announce(w io.Writer, tty bool, key config.Key, url string) {
	if key.Generated && tty {
		fmt.Fprintf(w, "E2B_API_KEY=%s\n", key.Value)
	} else {
		fmt.Fprintf(w, "# E2B_API_KEY is the key in %s (%s)\n", key.From, apikey.Fingerprint(key.Value))
	}
	fmt.Fprintf(w, "E2B_API_URL=%s\nE2B_SANDBOX_URL=%s\n", url, url)
}

// buildHost starts build sandboxes as the manager's private ones.
type buildHost struct {
	m *sandbox.Manager
	b sandbox.Backend
}

func (h buildHost) StartBox(ctx context.Context, p policy.Policy) (build.Box, error) {
	return h.m.StartPrivate(ctx, h.b, p)
}

// newNetwork makes the host side of sandboxes' networks and removes what
// a dead daemon's sandboxes left of theirs; nil when the configuration
// disables networks.
func newNetwork(cfg *config.Config, log *slog.Logger) (*hostNetwork, error) {
	if cfg.Network.Disabled {
		return nil, nil
	}
	ncfg, err := config.NetworkHost(cfg)
	if err != nil {
		return nil, err
	}
	h, err := netpolicy.NewHost(ncfg, log)
	if errors.Is(err, netpolicy.ErrUnavailable) {
		// The rest of the server works; requests for a network are told
		// why there is none.
		log.Warn("sandboxes cannot have networks on this host", "err", err)
		return &hostNetwork{unavailable: err}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := h.Cleanup(); err != nil {
		log.Warn("cleanup of earlier sandbox networks", "err", err)
	}
	return &hostNetwork{h: h}, nil
}

// hostNetwork is a netpolicy.Host as the manager sees it, or why the
// host has none.
type hostNetwork struct {
	h           *netpolicy.Host
	unavailable error
}

func (n *hostNetwork) Attach(ctx context.Context, id string, pol policy.Network) (sandbox.NetAttachment, error) {
	if n.unavailable != nil {
		return nil, fmt.Errorf("%w: this host cannot give sandboxes a network (the server log says why): create with allowInternetAccess (allow_internet_access) false and without network.allowOut/denyOut", sandbox.ErrInvalid)
	}
	a, err := n.h.Attach(ctx, id, pol)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// checkStateDir refuses, before anything is started, what would make the
// state directory unusable.
func checkStateDir(dir string) error {
	if os.Geteuid() != 0 {
		return usageError{namespaces.ErrNotRoot.Error()}
	}
	if !filepath.IsAbs(dir) {
		return usageError{fmt.Sprintf("state directory %q is not an absolute path", dir)}
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
	if _, err := backends.get("namespaces"); err != nil {
		return err
	}
	for _, b := range backends.m {
		if err := b.Cleanup(ctx); err != nil {
			log.Warn("cleanup of an earlier run", "backend", b.Name(), "err", err)
		}
	}
	return nil
}

// backends makes each backend once, when first asked for, with its state
// below the daemon's state directory.
type backends struct {
	stateDir, runsc string
	log             *slog.Logger
	m               map[string]sandbox.Backend
}

func newBackends(stateDir, runsc string, log *slog.Logger) *backends {
	return &backends{stateDir: stateDir, runsc: runsc, log: log, m: map[string]sandbox.Backend{}}
}

// get returns the backend called name ("" is namespaces); gvisor needs
// runsc, found from the configured path, $AIRLOCK_RUNSC or PATH.
func (bs *backends) get(name string) (sandbox.Backend, error) {
	if name == "" {
		name = "namespaces"
	}
	if b, ok := bs.m[name]; ok {
		return b, nil
	}
	var b sandbox.Backend
	switch name {
	case "namespaces":
		b = namespaces.New(filepath.Join(bs.stateDir, "run"), bs.log)
	case "gvisor":
		runsc, err := gvisor.FindRunsc(bs.runsc)
		if err != nil {
			return nil, err
		}
		b = gvisor.New(runsc, filepath.Join(bs.stateDir, "gvisor"), bs.log)
	default:
		return nil, fmt.Errorf("unknown backend %q (namespaces or gvisor)", name)
	}
	bs.m[name] = b
	return b, nil
}
