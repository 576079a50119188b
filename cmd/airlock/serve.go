package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend/gvisor"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/httpapi"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// serveConfig is the daemon's configuration: built-in defaults, then the
// config file, then environment variables, then flags.
type serveConfig struct {
	Listen   string `json:"listen"`
	StateDir string `json:"stateDir"`
	Backend  string `json:"backend"`
	Runsc    string `json:"runsc"`
	// AllowRequestBackend lets a create request pick its backend
	// ("backend": "gvisor"); both backends must then be usable.
	AllowRequestBackend bool                      `json:"allowRequestBackend"`
	DefaultTimeout      duration                  `json:"defaultTimeout"`
	MaxTimeout          duration                  `json:"maxTimeout"`
	MaxSandboxes        int                       `json:"maxSandboxes"`
	PoolMemoryBudget    size                      `json:"poolMemoryBudget"`
	Templates           map[string]templateConfig `json:"templates"`
}

// templateConfig overrides a template's limits and pool size; a field
// that is absent keeps the default, one that is present is validated.
type templateConfig struct {
	Memory   *size    `json:"memory"`
	Pids     *int64   `json:"pids"`
	CPUs     *float64 `json:"cpus"`
	Disk     *size    `json:"disk"`
	PoolSize *int     `json:"poolSize"`
	Backend  string   `json:"backend"` // this template's isolation, if not the server's
}

// duration reads "30s" style strings in JSON.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration like \"300s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q (want e.g. \"300s\")", s)
	}
	*d = duration(v)
	return nil
}

// size reads "512M" style strings in JSON.
type size int64

func (z *size) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a size like \"512M\": %w", err)
	}
	v, err := policy.ParseSize(s)
	*z = size(v)
	return err
}

// builtinTemplates are the templates every server has.
var builtinTemplates = []string{"base", "code-interpreter-v1"}

func defaultServeConfig() serveConfig {
	return serveConfig{
		Listen:           "127.0.0.1:49982",
		StateDir:         "/var/lib/airlock",
		DefaultTimeout:   duration(300 * time.Second),
		MaxTimeout:       duration(24 * time.Hour),
		PoolMemoryBudget: size(1 << 30),
	}
}

func serveCmd(args []string) error {
	// Catch SIGTERM from the start: one that arrives while sandboxes are
	// being started must still shut down cleanly, not kill the daemon.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A log reader that goes away (a closed terminal, a parent that
	// exited) must not kill the daemon: Go exits on SIGPIPE from a write
	// to stdout or stderr unless the signal is handled. Writes then fail.
	signal.Ignore(syscall.SIGPIPE)
	cfg := defaultServeConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", os.Getenv("AIRLOCK_CONFIG"), "JSON config file")
	listen := fs.String("listen", "", "address to listen on (default 127.0.0.1:49982)")
	stateDir := fs.String("state-dir", "", "state directory (default /var/lib/airlock)")
	poolSize := fs.Int("pool-size", -1, "ready sandboxes kept per template (default 2)")
	backendName := fs.String("backend", "", "isolation: namespaces (default) or gvisor")
	runscPath := fs.String("runsc", "", "runsc binary for the gvisor backend (default $AIRLOCK_RUNSC, then PATH)")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			return usageError{fmt.Sprintf("config file: %v", errors.Unwrap(err))}
		}
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return usageError{fmt.Sprintf("config file %s: %v", *configPath, err)}
		}
	}
	for env, dst := range map[string]*string{"AIRLOCK_LISTEN": &cfg.Listen, "AIRLOCK_STATE_DIR": &cfg.StateDir} {
		if v := os.Getenv(env); v != "" {
			*dst = v
		}
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *stateDir != "" {
		cfg.StateDir = *stateDir
	}
	if *backendName != "" {
		cfg.Backend = *backendName
	}
	if *runscPath != "" {
		cfg.Runsc = *runscPath
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	backends := map[string]sandbox.Backend{}
	backendFor := func(name string) (sandbox.Backend, error) {
		if name == "" {
			name = "namespaces"
		}
		if b, ok := backends[name]; ok {
			return b, nil
		}
		b, err := newBackend(name, cfg.Runsc, log)
		if err != nil {
			return nil, err
		}
		backends[name] = b
		return b, nil
	}
	backend, err := backendFor(cfg.Backend)
	if err != nil {
		return usageError{err.Error()}
	}
	mcfg, err := managerConfig(&cfg, *poolSize)
	if err != nil {
		return usageError{err.Error()}
	}
	if cfg.AllowRequestBackend {
		for _, name := range []string{"namespaces", "gvisor"} {
			if _, err := backendFor(name); err != nil {
				return usageError{fmt.Sprintf("allowRequestBackend needs every backend: %v", err)}
			}
		}
		mcfg.AllowRequestBackend, mcfg.Backends = true, backends
	}
	for i, t := range mcfg.Templates {
		if tc, ok := cfg.Templates[t.Name]; ok && tc.Backend != "" {
			b, err := backendFor(tc.Backend)
			if err != nil {
				return usageError{fmt.Sprintf("template %s: %v", t.Name, err)}
			}
			mcfg.Templates[i].Backend = b
		}
	}
	if err := checkStateDir(cfg.StateDir); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return usageError{fmt.Sprintf("listen on %s: %v", cfg.Listen, errors.Unwrap(err))}
	}
	if err := openStateDir(cfg.StateDir, runscOf(backends["gvisor"]), log); err != nil {
		return err
	}
	namespaces.SweepOrphanCgroups()
	key, err := apiKey(cfg.StateDir)
	if err != nil {
		return err
	}

	m := sandbox.NewManager(mcfg, backend, log)
	api := httpapi.New(m, key, log)
	// MCP's streamable HTTP transport: a session's sandbox lives as long
	// as the session, which ends when the client closes it or goes idle.
	mcpServer := mcp.New(m, time.Duration(cfg.DefaultTimeout), log)
	api.HandleAuthenticated("/mcp", sdk.NewStreamableHTTPHandler(
		func(*http.Request) *sdk.Server { return mcpServer },
		&sdk.StreamableHTTPOptions{SessionTimeout: time.Duration(cfg.DefaultTimeout), Logger: log}))
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 30 * time.Second}
	url := "http://" + ln.Addr().String()
	fmt.Printf("E2B_API_KEY=%s\nE2B_API_URL=%s\nE2B_SANDBOX_URL=%s\n", key, url, url)
	log.Info("airlock serving", "listen", ln.Addr().String(), "state_dir", cfg.StateDir)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		log.Info("shutting down")
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(shutdown)
	m.Shutdown()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func managerConfig(cfg *serveConfig, poolSize int) (sandbox.Config, error) {
	mc := sandbox.Config{
		PoolMemoryBudget: int64(cfg.PoolMemoryBudget),
		DefaultTTL:       time.Duration(cfg.DefaultTimeout),
		MaxTTL:           time.Duration(cfg.MaxTimeout),
		MaxSandboxes:     cfg.MaxSandboxes,
	}
	if mc.DefaultTTL <= 0 || mc.MaxTTL < mc.DefaultTTL {
		return mc, errors.New("defaultTimeout must be positive and at most maxTimeout")
	}
	for name := range cfg.Templates {
		if !strings.Contains(strings.Join(builtinTemplates, " "), name) {
			return mc, fmt.Errorf("unknown template %q in config (have %s)", name, strings.Join(builtinTemplates, ", "))
		}
	}
	for _, name := range builtinTemplates {
		p := policy.Default()
		size := 2
		if poolSize >= 0 {
			size = poolSize
		}
		if tc, ok := cfg.Templates[name]; ok {
			if tc.Memory != nil {
				p.MemoryBytes = int64(*tc.Memory)
			}
			if tc.Pids != nil {
				p.Pids = *tc.Pids
			}
			if tc.CPUs != nil {
				p.CPUs = *tc.CPUs
			}
			if tc.Disk != nil {
				p.DiskBytes = int64(*tc.Disk)
			}
			if tc.PoolSize != nil && poolSize < 0 {
				size = *tc.PoolSize
			}
		}
		if name == "code-interpreter-v1" {
			// Its agent starts a Python kernel while the sandbox waits in
			// the pool (importing ipykernel alone costs ~0.4 s).
			p.Env = append(p.Env, agentproto.PrestartEnv+"=python")
		}
		if err := p.Validate(); err != nil {
			return mc, fmt.Errorf("template %s: %w", name, err)
		}
		if size < 0 || size > 1000 {
			return mc, fmt.Errorf("template %s: pool size %d is out of range", name, size)
		}
		mc.Templates = append(mc.Templates, sandbox.Template{Name: name, Policy: p, PoolSize: size})
	}
	return mc, nil
}

// apiKey returns the key clients must present: AIRLOCK_API_KEY if set,
// else the one stored in the state directory, created on first start.
func apiKey(stateDir string) (string, error) {
	if k := os.Getenv("AIRLOCK_API_KEY"); k != "" {
		return k, nil
	}
	path := filepath.Join(stateDir, "api-key")
	if data, err := os.ReadFile(path); err == nil {
		if k := strings.TrimSpace(string(data)); k != "" {
			return k, nil
		}
	}
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	k := "e2b_" + hex.EncodeToString(b[:])
	if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("store API key: %w", err)
	}
	return k, nil
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
func openStateDir(dir, runsc string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	namespaces.StateDir = filepath.Join(dir, "run")
	gvisor.StateDir = filepath.Join(dir, "gvisor")
	if err := namespaces.Cleanup(); err != nil {
		log.Warn("cleanup of an earlier run", "err", err)
	}
	if runsc != "" {
		if err := gvisor.Cleanup(runsc); err != nil {
			log.Warn("cleanup of an earlier run's gVisor sandboxes", "err", err)
		}
	}
	return nil
}

// newBackend returns the backend called name ("" is namespaces); gvisor
// needs runsc, found from runscPath, $AIRLOCK_RUNSC or PATH.
func newBackend(name, runscPath string, log *slog.Logger) (sandbox.Backend, error) {
	switch name {
	case "", "namespaces":
		return nsBackend{log: log}, nil
	case "gvisor":
		runsc, err := gvisor.FindRunsc(runscPath)
		if err != nil {
			return nil, err
		}
		return gvBackend{runsc: runsc, log: log}, nil
	}
	return nil, fmt.Errorf("unknown backend %q (namespaces or gvisor)", name)
}

// runscOf is b's runsc if b is the gvisor backend, else "".
func runscOf(b sandbox.Backend) string {
	if gb, ok := b.(gvBackend); ok {
		return gb.runsc
	}
	return ""
}

// nsBackend starts sandboxes on the namespaces backend.
type nsBackend struct{ log *slog.Logger }

func (b nsBackend) Start(ctx context.Context, p policy.Policy) (sandbox.Instance, error) {
	s, err := namespaces.StartAgent(p, &lineLog{log: b.log})
	if err != nil {
		return nil, err
	}
	return nsInstance{s}, nil
}

type nsInstance struct{ *namespaces.AgentSandbox }

// gvBackend starts sandboxes under gVisor.
type gvBackend struct {
	runsc string
	log   *slog.Logger
}

func (b gvBackend) Start(ctx context.Context, p policy.Policy) (sandbox.Instance, error) {
	return gvisor.StartAgent(b.runsc, p, &lineLog{log: b.log})
}

func (i nsInstance) Wait() error {
	_, err := i.AgentSandbox.Wait()
	return err
}

// lineLog passes what an agent writes to its stderr (its own errors, a
// crash's trace) to the daemon's log, a line at a time.
type lineLog struct {
	log *slog.Logger
	buf []byte
}

func (l *lineLog) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) > 4096 { // an endless line: flush what there is
				i = len(l.buf)
			} else {
				return len(b), nil
			}
		}
		l.log.Warn("agent", "line", string(l.buf[:i]))
		l.buf = l.buf[min(i+1, len(l.buf)):]
	}
}
