package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/backend/fake"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// testKey is a key strong enough for apikey.Check.
const testKey = "e2b_0123456789abcdef0123456789abcdef01234567"

// resolve is the configuration of airlock serve with args, env and a
// config file of the JSON file ("": none), as serveCmd resolves it.
func resolve(t *testing.T, file string, env map[string]string, args ...string) config.Config {
	t.Helper()
	if file != "" {
		path := filepath.Join(t.TempDir(), "airlock.json")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags := config.ServeFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Resolve(func(k string) string { return env[k] }, flags)
	if err != nil {
		t.Fatal(err)
	}
	return onTheJail(cfg)
}

// onTheJail puts the stock templates on the jail: these tests' fake
// backends run no image, and they run as nobody too, who may not open
// the host's cache of the Debian root. The SDK suites run that root.
func onTheJail(cfg config.Config) config.Config {
	cfg.Stock.Root = config.StockJail
	return cfg
}

// fakes are fake backends by name, their instances under the test's
// directory.
func fakes(t *testing.T, names ...string) map[string]sandbox.Backend {
	m := map[string]sandbox.Backend{}
	for _, n := range names {
		b := fake.New(t.TempDir(), nil)
		b.SetMemory(20 << 20)
		m[n] = b
	}
	return m
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
}

// running is a daemon serving until the test ends (or stop).
type running struct {
	*Daemon
	stop func() error // ends Serve and returns what it returned
}

func serve(t *testing.T, cfg config.Config, backends map[string]sandbox.Backend) *running {
	t.Helper()
	d, err := New(t.Context(), cfg, Options{Log: testLog(t), Backends: backends})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx) }()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-served
	})
	t.Cleanup(func() { stop() })
	return &running{Daemon: d, stop: stop}
}

// call sends a request to the daemon with key ("": none) and returns the
// status, the headers and the body.
func call(t *testing.T, d *Daemon, method, path, key, body string) (int, http.Header, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, d.URL()+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

// TestServeAssembles: a daemon on the fake backend, as the test's user,
// serves every part airlock serve has (health, the API, metrics, the
// console, template builds, MCP), and Serve's end stops them all.
func TestServeAssembles(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	backends := fakes(t, "fake")
	cfg := resolve(t, `{"network": {"disabled": true}}`, nil, "--listen", "127.0.0.1:0", "--state-dir", state, "--backend", "fake", "--pool-size", "0")
	d := serve(t, cfg, backends)

	// A key made on first start, kept in the state directory, closed to
	// others as the directory is.
	key := d.Key()
	if !key.Generated || key.From != filepath.Join(state, "api-key") || !strings.HasPrefix(key.Value, "e2b_") {
		t.Errorf("key %+v, want one generated in %s", key, state)
	}
	for _, p := range []string{state, filepath.Join(state, "api-key"), filepath.Join(state, "token-key")} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: %v %v, want it closed to others", p, fi.Mode(), err)
		}
	}
	if code, _, body := call(t, d.Daemon, "GET", "/health", "", ""); code != 200 || body != "ok\n" {
		t.Errorf("health: %d %q", code, body)
	}
	if code, _, _ := call(t, d.Daemon, "GET", "/metrics", "", ""); code != http.StatusUnauthorized {
		t.Errorf("metrics without the key: %d, want 401", code)
	}
	if code, hdr, _ := call(t, d.Daemon, "GET", "/metrics", key.Value, ""); code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Errorf("metrics: %d %s", code, hdr.Get("Content-Type"))
	}
	// The console's page, built or not, comes with its policy.
	if _, hdr, _ := call(t, d.Daemon, "GET", "/", "", ""); !strings.Contains(hdr.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("/ without the console's CSP: %v", hdr)
	}
	// The template build API answers as itself, not as a missing route.
	if code, hdr, body := call(t, d.Daemon, "POST", "/v3/templates", key.Value, `{"name": "Not A Name"}`); code != http.StatusBadRequest || hdr.Get("Content-Type") != "application/json" {
		t.Errorf("template build request: %d %s %s, want the API's 400", code, hdr.Get("Content-Type"), body)
	}

	// A sandbox on the configured backend, whose hosts are at the
	// listening port by default.
	code, _, body := call(t, d.Daemon, "POST", "/v2/sandboxes", key.Value, `{"templateID": "base"}`)
	var sb struct {
		SandboxID string `json:"sandboxID"`
		Domain    string `json:"domain"`
	}
	if err := json.Unmarshal([]byte(body), &sb); code != http.StatusCreated || err != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(d.URL(), "http://"))
	if sb.Domain != "localhost:"+port {
		t.Errorf("domain %q, want localhost:%s", sb.Domain, port)
	}
	b := backends["fake"].(*fake.Backend)
	if b.Live() != 1 {
		t.Errorf("%d fake instances live, want the sandbox's", b.Live())
	}

	// MCP over HTTP, behind the key.
	if code, _, _ := call(t, d.Daemon, "POST", "/mcp", "", `{}`); code != http.StatusUnauthorized {
		t.Errorf("/mcp without the key: %d, want 401", code)
	}
	client := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	session, err := client.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: d.URL() + "/mcp",
		HTTPClient: &http.Client{Transport: keyed{key.Value}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := session.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(tools.Tools, func(tl *sdk.Tool) bool { return tl.Name == "run_command" }) {
		t.Errorf("MCP tools %v, want run_command among them", tools.Tools)
	}
	session.Close()

	if err := d.stop(); err != nil {
		t.Errorf("Serve returned %v after its context ended, want nil", err)
	}
	if c, err := net.Dial("tcp", strings.TrimPrefix(d.URL(), "http://")); err == nil {
		c.Close()
		t.Error("the daemon's port still answers after Serve returned")
	}
	if b.Live() != 0 {
		t.Errorf("%d fake instances live after Serve returned, want none", b.Live())
	}
}

// TestSealedServer: network.default "none" seals the server: a create
// that says nothing works, one that asks for the internet gets 400 naming
// the setting. (With networks, see tests/e2b/network.test.mjs.)
func TestSealedServer(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	cfg := resolve(t, `{"network": {"default": "none", "disabled": true}}`, nil, "--listen", "127.0.0.1:0", "--state-dir", state, "--backend", "fake", "--pool-size", "0")
	d := serve(t, cfg, fakes(t, "fake"))
	key := d.Key().Value
	if code, _, body := call(t, d.Daemon, "POST", "/v2/sandboxes", key, `{}`); code != http.StatusCreated {
		t.Errorf("a create that says nothing of the network: %d %s", code, body)
	}
	for _, body := range []string{`{"allow_internet_access": true}`, `{"network": {"denyOut": ["203.0.113.20"]}}`} {
		if code, _, got := call(t, d.Daemon, "POST", "/v2/sandboxes", key, body); code != http.StatusBadRequest || !strings.Contains(got, `network.default \"none\"`) {
			t.Errorf("%s on a sealed server: %d %s, want 400 naming network.default", body, code, got)
		}
	}
	if err := d.stop(); err != nil {
		t.Error(err)
	}
}

// keyed sends the API key with every request.
type keyed struct{ key string }

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return http.DefaultTransport.RoundTrip(r)
}

// TestNewKeepsTheKey: a key given is used as it is; one stored by an
// earlier start is found again, not made anew.
func TestNewKeepsTheKey(t *testing.T) {
	state := t.TempDir()
	args := []string{"--listen", "127.0.0.1:0", "--state-dir", state, "--backend", "fake", "--pool-size", "0"}
	first := serve(t, resolve(t, `{"network": {"disabled": true}}`, nil, args...), fakes(t, "fake"))
	first.stop()
	again := serve(t, resolve(t, `{"network": {"disabled": true}}`, nil, args...), fakes(t, "fake"))
	if k := again.Key(); k.Generated || k.Value != first.Key().Value {
		t.Errorf("second start's key %+v, want the stored %q", k, first.Key().Value)
	}
	again.stop()
	given := serve(t, resolve(t, `{"network": {"disabled": true}}`, map[string]string{"AIRLOCK_API_KEY": testKey}, args...), fakes(t, "fake"))
	if k := given.Key(); k.Value != testKey || k.From != "AIRLOCK_API_KEY" || k.Generated {
		t.Errorf("with AIRLOCK_API_KEY: %+v", k)
	}
	if code, _, _ := call(t, given.Daemon, "GET", "/metrics", testKey, ""); code != 200 {
		t.Errorf("metrics with AIRLOCK_API_KEY's key: %d, want 200", code)
	}
}

// TestNewRefusesBadConfigs: a configuration the daemon cannot run is a
// *ConfigError, refused before the state directory is made.
func TestNewRefusesBadConfigs(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		args []string
		want string
	}{
		{name: "weak key", env: map[string]string{"AIRLOCK_API_KEY": "e2b_short"}, want: "AIRLOCK_API_KEY is too weak"},
		{name: "unknown backend", args: []string{"--backend", "vm"}, want: `unknown backend "vm" (fake)`},
		{name: "unknown template", file: `{"templates": {"gpu": {}}}`, want: `unknown template "gpu"`},
		{name: "a template's backend", file: `{"templates": {"base": {"backend": "vm"}}}`, want: `template base: unknown backend "vm"`},
		{name: "timeouts", file: `{"defaultTimeout": "2h", "maxTimeout": "1h"}`, want: "at most maxTimeout"},
		{name: "builds' network", file: `{"builds": {"network": "wifi"}}`, want: `builds.network "wifi": internet or none`},
		{name: "cluster flags without a node", args: []string{"--kubeconfig", "/k"}, want: "need --node-name"},
		{name: "node name", args: []string{"--node-name", "Node_1"}, want: "is not a DNS name"},
		{name: "relative state directory", args: []string{"--state-dir", "state"}, want: `state directory "state" is not an absolute path`},
		{name: "network subnet", file: `{"network": {"subnet": "ten"}}`, want: `network.subnet "ten" is not a CIDR prefix`},
		{name: "port taken", args: []string{"--listen", taken.Addr().String()}, want: "listen on " + taken.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			file := tc.file
			if file == "" {
				file = `{"network": {"disabled": true}}`
			}
			args := append([]string{"--listen", "127.0.0.1:0", "--state-dir", state, "--backend", "fake"}, tc.args...)
			_, err := New(t.Context(), resolve(t, file, tc.env, args...), Options{Log: testLog(t), Backends: fakes(t, "fake")})
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("New: %T %v, want a one-line *ConfigError naming %q", err, err, tc.want)
			}
			if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the state directory after a refused configuration: %v, want none made", err)
			}
		})
	}
}

// TestNewRefusesAStoredWeakKey: a weak key found in the state directory
// is refused, and the port taken by then is given back.
func TestNewRefusesAStoredWeakKey(t *testing.T) {
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, "api-key"), []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := resolve(t, `{"network": {"disabled": true}}`, nil, "--listen", addr, "--state-dir", state, "--backend", "fake")
	_, err = New(t.Context(), cfg, Options{Log: testLog(t), Backends: fakes(t, "fake")})
	if ce := (*ConfigError)(nil); !errors.As(err, &ce) || !strings.Contains(err.Error(), "too weak") {
		t.Fatalf("New with a weak stored key: %v, want a *ConfigError", err)
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the port after a refused start: %v, want it free", err)
	}
	ln.Close()
}

// TestAllowRequestBackend: a create picks any of the daemon's backends
// where the configuration allows it, and a node offers them all; else
// only the server's.
func TestAllowRequestBackend(t *testing.T) {
	args := []string{"--listen", "127.0.0.1:0", "--backend", "a", "--pool-size", "0"}
	backends := fakes(t, "a", "b")
	d := serve(t, resolve(t, `{"network": {"disabled": true}, "allowRequestBackend": true}`, map[string]string{"AIRLOCK_API_KEY": testKey},
		append(args, "--state-dir", t.TempDir())...), backends)
	if got := d.offered(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("offered %v, want a and b", got)
	}
	if code, _, body := call(t, d.Daemon, "POST", "/v2/sandboxes", testKey, `{"templateID": "base", "backend": "b"}`); code != http.StatusCreated {
		t.Fatalf("create on b: %d %s", code, body)
	}
	if a, b := backends["a"].(*fake.Backend).Starts(), backends["b"].(*fake.Backend).Starts(); a != 0 || b != 1 {
		t.Errorf("starts: a %d, b %d; want the sandbox on b", a, b)
	}

	one := serve(t, resolve(t, `{"network": {"disabled": true}}`, map[string]string{"AIRLOCK_API_KEY": testKey},
		append(args, "--state-dir", t.TempDir())...), fakes(t, "a", "b"))
	if got := one.offered(); !slices.Equal(got, []string{"fake"}) {
		t.Errorf("offered %v, want the server's backend only", got)
	}
	if code, _, body := call(t, one.Daemon, "POST", "/v2/sandboxes", testKey, `{"templateID": "base", "backend": "b"}`); code != http.StatusBadRequest {
		t.Errorf("create on b where requests may not choose: %d %s, want 400", code, body)
	}
}
