// Package daemon assembles Airlock's daemon from its configuration: the
// backends, the sandbox manager, sandboxes' networks, the image store and
// its builds, the HTTP API with MCP and the console, and a cluster node's
// registration. airlock serve runs New and Serve, airlock mcp ServeMCP.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/build"
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
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// ConfigError is a configuration the daemon cannot start with: the
// operator's to correct, told in one line (airlock exits 2).
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

func configError(err error) error { return &ConfigError{err.Error()} }

func configErrorf(format string, args ...any) error {
	return &ConfigError{fmt.Sprintf(format, args...)}
}

// Options are what a configuration does not say.
type Options struct {
	// Log is the daemon's log; nil discards.
	Log *slog.Logger
	// Backends, when set, are the daemon's only backends, by name, in
	// place of the namespaces and gVisor ones (tests give the fake
	// backend); the configuration's backend names one of them.
	Backends map[string]sandbox.Backend
}

func (o Options) log() *slog.Logger {
	if o.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Log
}

// Daemon is airlock serve: its parts made, its port taken; Serve runs it.
type Daemon struct {
	cfg       config.Config
	log       *slog.Logger
	backends  *backends
	egress    *egress
	isolation sandbox.Backend // the server's backend
	mcfg      sandbox.Config
	// builds are the settings of template builds; buildPolicy the policy
	// of their sandboxes.
	builds      config.Builds
	buildPolicy policy.Policy
	network     *hostNetwork // nil: networks are disabled

	// openFiles is the daemon's limit on open files: an idle sandbox
	// holds four, nine with a network (raiseFileLimit).
	openFiles uint64

	ln      net.Listener
	tls     *tls.Config // nil: plain HTTP
	key     Key
	manager *sandbox.Manager
	volumes *volume.Store
	service *build.Service // template builds, over the API
	api     *httpapi.Server
	run     *runServer // nil: another daemon of the state directory has it
}

// New makes the daemon of cfg, in the order that keeps a bad
// configuration from touching anything: every setting is checked, then
// the host's side of sandboxes' networks made, the port taken, the state
// directory opened and the parts started. A *ConfigError is the
// configuration's fault.
func New(ctx context.Context, cfg config.Config, opts Options) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: opts.log()}
	d.backends = newBackends(cfg.StateDir, cfg.Runsc, opts.Backends, d.log)
	if err := d.check(); err != nil {
		return nil, err
	}
	d.openFiles = raiseFileLimit()
	// Before any lock of this process, or any cleanup, is taken: what
	// sandboxes left running by an earlier daemon hold (live.go).
	if err := d.backends.keep(cfg.LiveRestore, netpolicy.SlotLocks()); err != nil {
		return nil, err
	}
	network, err := newNetwork(&d.cfg, d.log)
	if err != nil {
		return nil, configError(err)
	}
	if network != nil {
		d.network, d.mcfg.Network = network, network
	}
	ln, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return nil, configErrorf("listen on %s: %v", d.cfg.Listen, errors.Unwrap(err))
	}
	d.ln = ln
	if err := d.start(ctx); err != nil {
		ln.Close()
		return nil, err
	}
	return d, nil
}

// check refuses, before anything is touched, a configuration the daemon
// cannot run, and settles the manager's and the builds' settings.
func (d *Daemon) check() error {
	cfg := &d.cfg
	// A weak key is refused before anything starts (a stored one, once
	// the state directory is open, by apiKey).
	if cfg.APIKey != "" {
		if err := apikey.Check("AIRLOCK_API_KEY", cfg.APIKey); err != nil {
			return configError(err)
		}
	}
	var err error
	if d.isolation, err = d.backends.get(cfg.Backend); err != nil {
		return configError(err)
	}
	if d.mcfg, err = managerConfig(cfg, d.backends.get); err != nil {
		return configError(err)
	}
	if d.builds, d.buildPolicy, err = BuildSettings(cfg); err != nil {
		return configError(err)
	}
	if err := checkNode(cfg.Node); err != nil {
		return err
	}
	if d.tls, err = serverTLS(cfg); err != nil {
		return configError(err)
	}
	if err := checkStock(cfg.Stock); err != nil {
		return err
	}
	if cfg.Node.Name != "" {
		d.mcfg.IDPrefix = sandboxid.NodePrefix(cfg.Node.Name)
	}
	if cfg.AllowRequestBackend {
		for _, name := range d.backends.names {
			if _, err := d.backends.get(name); err != nil {
				return configErrorf("allowRequestBackend needs every backend: %v", err)
			}
		}
		d.mcfg.AllowRequestBackend, d.mcfg.Backends = true, d.backends.m
	}
	return d.backends.checkStateDir(cfg.StateDir)
}

// start opens the state directory and starts the daemon's parts on it.
func (d *Daemon) start(ctx context.Context) error {
	cfg := &d.cfg
	if err := openStateDir(ctx, cfg.StateDir, d.backends, d.log); err != nil {
		return err
	}
	// The egress CA, which networked sandboxes trust, and the secrets
	// that request rules fill in: before any sandbox starts or is taken
	// back.
	eg, err := openEgress(cfg.StateDir, cfg.Audit, d.log)
	if err != nil {
		return err
	}
	d.egress = eg
	if err := d.backends.trustCA(eg.ca.PEM()); err != nil {
		return err
	}
	d.network.useEgress(eg)
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
	// An image's template has base's limits, taken before base is put on
	// the stock root: an image keeps its own root and environment.
	for _, t := range d.mcfg.Templates {
		if t.Name == "base" {
			d.mcfg.Source = imageTemplates{Store: images, Base: t.Policy, PoolSize: imagePool, ReadyTimeout: time.Duration(d.builds.ReadyTimeout), Backends: d.backends.get}
		}
	}
	stockImages, err := stockTemplates(ctx, cfg, &d.mcfg, d.log)
	if err != nil {
		return err
	}
	if stockImages != nil {
		// Templates build on base and code-interpreter-v1 as on images.
		images.Share(stockImages)
	}
	d.backends.sweep()
	if d.key, err = apiKey(cfg.APIKey, cfg.StateDir); err != nil {
		return configError(err)
	}
	if d.mcfg.TokenKey, err = tokenKey(cfg.StateDir); err != nil {
		return err
	}
	files, err := build.OpenFiles(filepath.Join(cfg.StateDir, "images", "uploads"), int64(d.builds.Upload))
	if err != nil {
		return err
	}
	if d.volumes, err = volume.Open(filepath.Join(cfg.StateDir, "volumes"), int64(cfg.Volumes.Size), d.mcfg.IDPrefix, d.log); err != nil {
		return configError(err)
	}
	d.mcfg.Volumes = d.volumes
	// E2B's rule: the internet unless asked otherwise, so the pools keep
	// sandboxes in networks, closed until claimed.
	d.mcfg.NetworkedPools = d.internetByDefault()
	d.mcfg.Sealed = cfg.Network.Sealed()
	d.manager = sandbox.NewManager(d.mcfg, d.isolation, d.log)
	// Once the manager has taken back the networks of the sandboxes an
	// earlier daemon left running: the rest are leftovers.
	d.network.cleanup(d.log)
	d.api = d.handler(images, files)
	if d.run, err = listenRun(cfg.StateDir, d.manager, cfg.Network.Sealed(), d.log); err != nil {
		d.manager.Shutdown()
		d.closeVolumes()
		return err
	}
	return nil
}

// handler is the HTTP API over the manager, with the console, template
// builds and MCP.
func (d *Daemon) handler(images *image.Store, files *build.Files) *httpapi.Server {
	cfg := &d.cfg
	if cfg.Domain == "" {
		_, port, _ := net.SplitHostPort(d.ln.Addr().String())
		cfg.Domain = "localhost:" + port
		if !nssResolvesLocalhost("/etc/nsswitch.conf") {
			d.log.Warn("this host does not resolve names under localhost: getHost(port) URLs work only in clients that resolve them themselves (curl, browsers); install libnss-myhostname, or set domain",
				"domain", cfg.Domain)
		}
	}
	api := httpapi.New(d.manager, d.key.Value, cfg.Domain, d.log)
	def := httpapi.NetDefault{Internet: d.internetByDefault()}
	if cfg.Network.Sealed() {
		def.SealedBy = `network.default "none"`
	}
	api.SetNetworkDefault(def)
	// The web console: a page that asks for the API key and calls the API.
	ui := console.Handler()
	api.HandlePublic("GET /{$}", ui)
	api.HandlePublic("GET /assets/", ui)
	// Builds run on the server's backend; with the internet only where
	// the host gives sandboxes networks.
	if d.network == nil || d.network.unavailable != nil {
		d.buildPolicy.Network = policy.Network{}
	}
	// Clients' pulls dial internet addresses of other hosts only, and
	// what the operator allows (checked in BuildSettings).
	rule, _ := pulls(d.builds)
	d.service = &build.Service{
		Builder: &build.Builder{Store: images, Files: files, Host: buildHost{d.manager, d.isolation}, Policy: d.buildPolicy,
			ReadyTimeout: time.Duration(d.builds.ReadyTimeout), Registries: rule.Transport()},
		Log: d.log, Timeout: time.Duration(d.builds.Timeout), Parallel: d.builds.Parallel,
	}
	api.HandleTemplates(&httpapi.Templates{Builds: d.service, Store: images, Files: files})
	api.HandleVolumes(d.volumes, d.mcfg.TokenKey)
	api.HandleSecrets(d.egress.secrets)
	api.HandleAudit(d.egress.audit)
	// MCP's streamable HTTP transport: a session's sandbox lives as long
	// as the session, which ends when the client closes it or goes idle.
	mcpServer := mcp.New(d.manager, time.Duration(cfg.DefaultTimeout), d.log)
	api.HandleAuthenticated("/mcp", sdk.NewStreamableHTTPHandler(
		func(*http.Request) *sdk.Server { return mcpServer },
		&sdk.StreamableHTTPOptions{SessionTimeout: time.Duration(cfg.DefaultTimeout), Logger: d.log}))
	return api
}

// internetByDefault reports whether the E2B API's sandboxes have the
// internet unless they ask otherwise: where the host gives networks and
// the server is not sealed. Elsewhere they have loopback only, and a
// request for a network is told why there is none.
func (d *Daemon) internetByDefault() bool {
	return d.network != nil && d.network.unavailable == nil && !d.cfg.Network.Sealed()
}

// closeVolumes unmounts the volumes, once no sandbox runs.
func (d *Daemon) closeVolumes() {
	if err := d.volumes.Close(); err != nil {
		d.log.Error("volumes", "err", err)
	}
}

// Key is the API key clients must present, and where it is kept.
func (d *Daemon) Key() Key { return d.key }

// URL is where the daemon answers.
func (d *Daemon) URL() string {
	if d.tls != nil {
		return "https://" + d.ln.Addr().String()
	}
	return "http://" + d.ln.Addr().String()
}

// Serve answers until ctx ends or the server fails, then shuts the
// daemon down: its port, its builds and its sandboxes.
func (d *Daemon) Serve(ctx context.Context) error {
	d.log.Info("airlock serving", "listen", d.ln.Addr().String(), "state_dir", d.cfg.StateDir,
		"api_key", apikey.Fingerprint(d.key.Value), "api_key_from", d.key.From, "open_files", d.openFiles)
	srv, errc := httpserve.Serve(d.ln, d.api, httpserve.Limits{MaxConns: d.cfg.MaxConnections, IdleTimeout: time.Duration(d.cfg.IdleTimeout), TLS: d.tls})
	if d.run != nil {
		go d.run.serve()
	}
	sweeping, stopSweep := context.WithCancel(ctx)
	defer stopSweep()
	go d.egress.sweep(sweeping, d.manager)
	// In a cluster the node registers once it answers, and deregisters
	// before it stops answering: routers never send it what it drops.
	leave := func() {}
	if d.cfg.Node.Name != "" {
		var err error
		if leave, err = joinCluster(d.cfg.Node, d.ln.Addr(), d.key.Value, d.offered(), d.mcfg.MaxSandboxes, d.log); err != nil {
			srv.Close()
			d.run.close()
			d.manager.Shutdown()
			d.run.wait()
			d.closeVolumes()
			d.network.close(d.log)
			return err
		}
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		d.log.Info("shutting down")
	}
	leave()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(shutdown)
	d.run.close()
	d.service.Shutdown()
	d.manager.Shutdown()
	d.run.wait()
	d.closeVolumes()
	d.network.close(d.log)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
