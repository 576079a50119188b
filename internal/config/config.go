// Package config is the daemon's configuration: its JSON schema, built-in
// defaults and templates, and how a configuration becomes the sandbox
// manager's.
package config

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Config is the daemon's configuration: built-in defaults, then the config
// file, then environment variables, then flags (Resolve).
type Config struct {
	Listen   string `json:"listen"`
	StateDir string `json:"stateDir"`
	Backend  string `json:"backend"`
	Runsc    string `json:"runsc"`
	// AllowRequestBackend lets a create request pick its backend
	// ("backend": "gvisor"); both backends must then be usable.
	AllowRequestBackend bool                `json:"allowRequestBackend"`
	DefaultTimeout      Duration            `json:"defaultTimeout"`
	MaxTimeout          Duration            `json:"maxTimeout"`
	MaxSandboxes        int                 `json:"maxSandboxes"`
	PoolMemoryBudget    Size                `json:"poolMemoryBudget"`
	Templates           map[string]Template `json:"templates"`
	// Domain: sandboxes' servers are reached at {port}-{sandboxID}.{domain}
	// (E2B's getHost); "" is localhost at the listening port.
	Domain  string  `json:"domain"`
	Network Network `json:"network"`
	Builds  Builds  `json:"builds"`
	// MetricsInterval: how often sandboxes are measured for getMetrics'
	// history (default 5s; an hour of samples is kept).
	MetricsInterval Duration `json:"metricsInterval"`
	// PauseInMemory: a pause freezes a sandbox in memory (fast, but it
	// keeps its RAM and dies with the daemon) even where its backend can
	// save it to disk (gVisor, without a network).
	PauseInMemory bool `json:"pauseInMemory"`
	// TemplatePoolSize is how many ready sandboxes a template made from
	// an image with a start command keeps, once it was first asked for
	// (default 1; 0: none).
	TemplatePoolSize *int `json:"templatePoolSize"`
	// MaxConnections bounds the connections the API's listener holds at
	// once (0: 4096; more wait until one closes), and IdleTimeout closes
	// a keep-alive connection idle that long between requests (0: 2m).
	MaxConnections int      `json:"maxConnections"`
	IdleTimeout    Duration `json:"idleTimeout"`

	// What no config file holds. APIKey is the key clients must present
	// ($AIRLOCK_API_KEY); "": the one kept in the state directory.
	APIKey string `json:"-"`
	// Node makes the daemon a node of a cluster.
	Node Node `json:"-"`
}

// Node is a cluster node's settings (airlock serve --node-name).
type Node struct {
	// Name is the node's ("": not a node); Kubeconfig and Namespace find
	// the cluster's API server and Airlock's objects in it; Advertise is
	// the URL at which routers reach the node ("": http://LISTEN).
	Name, Kubeconfig, Namespace, Advertise string
}

// Builds is how template builds run: each in a sandbox of its own.
type Builds struct {
	// Network: "internet" (the default; the always-denied addresses
	// stay denied) or "none".
	Network  string   `json:"network"`
	Memory   Size     `json:"memory"`   // default 2G
	Disk     Size     `json:"disk"`     // the writable layer; default 4G
	Timeout  Duration `json:"timeout"`  // one build; default 1h
	Parallel int      `json:"parallel"` // builds at once; default 2
	Upload   Size     `json:"upload"`   // one COPY's files; default 1G
	// ReadyTimeout bounds a start command's wait to be ready; default 60s.
	ReadyTimeout Duration `json:"readyTimeout"`
	// PrivateRegistries lets clients' builds pull from registries at
	// private addresses (10/8, 172.16/12, 192.168/16, fc00::/7: a
	// registry of the operator's own network), never at the host's own
	// addresses; by default only internet addresses are dialed.
	PrivateRegistries bool `json:"privateRegistries"`
	// RegistryAddresses are addresses or CIDR prefixes that clients'
	// builds may pull from whatever they are: loopback or the host's own
	// addresses included. For a registry on the host, or to let in one
	// registry rather than a whole private network.
	RegistryAddresses []string `json:"registryAddresses"`
}

// Pulls is the rule of the addresses clients' builds may pull from.
func (b Builds) Pulls() (build.PullRule, error) {
	r := build.PullRule{Private: b.PrivateRegistries}
	for _, s := range b.RegistryAddresses {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				return r, fmt.Errorf("builds.registryAddresses: %q is not an IP address or a CIDR prefix (127.0.0.1, 10.1.0.0/16)", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		r.Allow = append(r.Allow, p.Masked())
	}
	return r, nil
}

// BuildSettings is the builds' configuration with its defaults filled
// in, and the policy of build sandboxes (without their image).
func BuildSettings(cfg *Config) (Builds, policy.Policy, error) {
	b := cfg.Builds
	def := func(v *Size, d int64) {
		if *v == 0 {
			*v = Size(d)
		}
	}
	def(&b.Memory, 2<<30)
	def(&b.Disk, 4<<30)
	def(&b.Upload, 1<<30)
	if b.Timeout == 0 {
		b.Timeout = Duration(time.Hour)
	}
	if b.ReadyTimeout == 0 {
		b.ReadyTimeout = Duration(time.Minute)
	}
	if b.Parallel == 0 {
		b.Parallel = 2
	}
	p := policy.Default()
	p.MemoryBytes, p.DiskBytes, p.Pids = int64(b.Memory), int64(b.Disk), 4096
	switch b.Network {
	case "", "internet":
		b.Network = "internet"
		p.Network = policy.Network{Mode: policy.NetInternet}
	case "none":
	default:
		return b, p, fmt.Errorf("builds.network %q: internet or none", b.Network)
	}
	if b.Parallel < 0 || b.Timeout < 0 || b.ReadyTimeout < 0 {
		return b, p, errors.New("builds: parallel and timeouts must not be negative")
	}
	if _, err := b.Pulls(); err != nil {
		return b, p, err
	}
	return b, p, p.Validate()
}

// Network is what the server offers sandboxes that ask for a network.
type Network struct {
	// Disabled: no sandbox gets a network; asking for one is refused.
	Disabled bool `json:"disabled"`
	// Subnet numbers the sandboxes' veth pairs, a /30 each.
	Subnet string `json:"subnet"`
	// DNS are the upstream servers of the sandboxes' resolver, IP[:PORT];
	// none: the host's /etc/resolv.conf.
	DNS []string `json:"dns"`
	// LocalZones are DNS zones of the host's network, such as a
	// cluster's own domain, under which no sandbox's lookup leaves the
	// host (beyond cluster.local, svc, local, internal and the host's
	// search domains, always refused).
	LocalZones []string `json:"localZones"`
	// Connections a sandbox may have open at once (0: 256), and its
	// bandwidth in bytes per second each way (0: no limit).
	Connections int  `json:"connections"`
	Bandwidth   Size `json:"bandwidth"`
	// DNSRate and ConnectionRate bound the DNS packets and the new TCP
	// connections a sandbox sends, as "N/s", "N/m" or "N/h" with bursts
	// of twice N (empty: 100/s and 200/s); the host's nftables rules drop
	// the excess before it reaches the daemon.
	DNSRate        string `json:"dnsRate"`
	ConnectionRate string `json:"connectionRate"`
}

// NetworkHost returns the network configuration of cfg.
func NetworkHost(cfg *Config) (netpolicy.Config, error) {
	n := netpolicy.Config{Upstream: cfg.Network.DNS, LocalZones: cfg.Network.LocalZones,
		Limits: netpolicy.Limits{Connections: cfg.Network.Connections, Bandwidth: int64(cfg.Network.Bandwidth)}}
	if cfg.Network.Subnet != "" {
		p, err := netip.ParsePrefix(cfg.Network.Subnet)
		if err != nil {
			return n, fmt.Errorf("network.subnet %q is not a CIDR prefix", cfg.Network.Subnet)
		}
		n.Subnet = p
	}
	if n.Limits.Connections < 0 || n.Limits.Bandwidth < 0 {
		return n, errors.New("network.connections and network.bandwidth must not be negative")
	}
	for _, r := range []struct {
		field, s string
		to       *netpolicy.Rate
	}{{"dnsRate", cfg.Network.DNSRate, &n.Limits.DNSRate}, {"connectionRate", cfg.Network.ConnectionRate, &n.Limits.ConnectionRate}} {
		if r.s == "" {
			continue
		}
		rate, err := netpolicy.ParseRate(r.s)
		if err != nil {
			return n, fmt.Errorf("network.%s: %v", r.field, err)
		}
		*r.to = rate
	}
	return n, nil
}

// Template overrides a template's limits and pool size; a field that is
// absent keeps the default, one that is present is validated.
type Template struct {
	Memory   *Size    `json:"memory"`
	Pids     *int64   `json:"pids"`
	CPUs     *float64 `json:"cpus"`
	Disk     *Size    `json:"disk"`
	PoolSize *int     `json:"poolSize"`
	Backend  string   `json:"backend"` // this template's isolation, if not the server's
}

// Duration reads "30s" style strings in JSON.
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration like \"300s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q (want e.g. \"300s\")", s)
	}
	*d = Duration(v)
	return nil
}

// Size reads "512M" style strings in JSON.
type Size int64

func (z *Size) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a size like \"512M\": %w", err)
	}
	v, err := policy.ParseSize(s)
	*z = Size(v)
	return err
}

// CodeInterpreter is the template whose sandboxes start a Python kernel
// while they wait in the pool.
const CodeInterpreter = "code-interpreter-v1"

// Builtin are the templates every server has.
var Builtin = []string{"base", CodeInterpreter}

// Default is the configuration of a server started without one.
func Default() Config {
	return Config{
		Listen:           "127.0.0.1:49982",
		StateDir:         "/var/lib/airlock",
		DefaultTimeout:   Duration(300 * time.Second),
		MaxTimeout:       Duration(24 * time.Hour),
		PoolMemoryBudget: Size(1 << 30),
	}
}

// Load reads the config file at path over cfg. Unknown fields are refused:
// a misspelt limit must not be silently ignored.
func Load(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %v", errors.Unwrap(err))
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("config file %s: %v", path, err)
	}
	return nil
}

// Manager returns the sandbox manager's configuration for cfg.
// backendFor returns the backend of a name ("" is the server's); it is
// asked only for the backends cfg names.
func Manager(cfg *Config, backendFor func(name string) (sandbox.Backend, error)) (sandbox.Config, error) {
	mc := sandbox.Config{
		PoolMemoryBudget: int64(cfg.PoolMemoryBudget),
		DefaultTTL:       time.Duration(cfg.DefaultTimeout),
		MaxTTL:           time.Duration(cfg.MaxTimeout),
		MaxSandboxes:     cfg.MaxSandboxes,
		MetricsInterval:  time.Duration(cfg.MetricsInterval),
		StateDir:         cfg.StateDir,
		BackendByName:    backendFor,
		PauseInMemory:    cfg.PauseInMemory,
	}
	if mc.DefaultTTL <= 0 || mc.MaxTTL < mc.DefaultTTL {
		return mc, errors.New("defaultTimeout must be positive and at most maxTimeout")
	}
	if cfg.MaxConnections < 0 || cfg.IdleTimeout < 0 {
		return mc, errors.New("maxConnections and idleTimeout must not be negative")
	}
	for name := range cfg.Templates {
		if !slices.Contains(Builtin, name) {
			return mc, fmt.Errorf("unknown template %q in config (have %s)", name, strings.Join(Builtin, ", "))
		}
	}
	for _, name := range Builtin {
		t := sandbox.Template{Name: name, Policy: policy.Default(), PoolSize: 2}
		p := &t.Policy
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
			if tc.PoolSize != nil {
				t.PoolSize = *tc.PoolSize
			}
			if tc.Backend != "" {
				b, err := backendFor(tc.Backend)
				if err != nil {
					return mc, fmt.Errorf("template %s: %w", name, err)
				}
				t.Backend = b
			}
		}
		if name == CodeInterpreter {
			// Its agent starts a Python kernel while the sandbox waits in
			// the pool (importing ipykernel alone costs ~0.4 s).
			p.Env = append(p.Env, agentproto.PrestartEnv+"=python")
			// Where the backend can, its pool is of clones of one whose
			// kernel had started, rather than each starting its own.
			t.WarmSnapshot = true
		}
		if err := p.Validate(); err != nil {
			return mc, fmt.Errorf("template %s: %w", name, err)
		}
		if t.PoolSize < 0 || t.PoolSize > 1000 {
			return mc, fmt.Errorf("template %s: pool size %d is out of range", name, t.PoolSize)
		}
		mc.Templates = append(mc.Templates, t)
	}
	return mc, nil
}

// Images makes the templates of an image store: each image is a template
// of its name, with the limits of base (or less, as the image asks) and
// root inside. One with a start command keeps PoolSize sandboxes ready,
// started and ready-checked, once it has been asked for.
type Images struct {
	Store        *image.Store
	Base         policy.Policy
	PoolSize     int
	ReadyTimeout time.Duration
	// Backends finds the backend a snapshot was taken on, which alone
	// can clone it.
	Backends func(name string) (sandbox.Backend, error)
}

// Template returns the template of the image called name.
func (s Images) Template(name string) (sandbox.Template, error) {
	name = build.Normalize(name)
	img, err := s.Store.Get(name)
	if errors.Is(err, image.ErrNotFound) || image.CheckName(name) != nil {
		return sandbox.Template{}, fmt.Errorf("%w %q", sandbox.ErrUnknownTemplate, name)
	}
	if err != nil {
		return sandbox.Template{}, err
	}
	if img.Snapshot != nil {
		return s.snapshot(img)
	}
	p := s.Base
	if err := s.Store.Apply(img, &p, false); err != nil {
		return sandbox.Template{}, err
	}
	// Its agent runs as the sandbox's root, so that commands and files
	// may be root's or the user's, as E2B's templates have both.
	p.Root = true
	r := img.Resources
	if r.CPUs > 0 {
		p.CPUs = min(p.CPUs, r.CPUs)
	}
	if r.MemoryMB > 0 {
		p.MemoryBytes = min(p.MemoryBytes, r.MemoryMB<<20)
	}
	if r.DiskMB > 0 {
		p.DiskBytes = min(p.DiskBytes, r.DiskMB<<20)
	}
	t := sandbox.Template{Name: name, Policy: p, Version: img.Created.String() + strings.Join(img.Layers, ",")}
	if img.Config.StartCmd != "" {
		cfg := img.Config
		t.PoolSize, t.WarmSnapshot = s.PoolSize, true
		t.Ready = func(ctx context.Context, c *agentproto.Client) error {
			return build.Start(ctx, c, &cfg, s.ReadyTimeout, func(string, string) {})
		}
	}
	return t, nil
}

// snapshot is the template of snapshot img: clones of the sandbox it was
// taken of, under that sandbox's policy, kept ready as an image's with a
// start command are.
func (s Images) snapshot(img *image.Image) (sandbox.Template, error) {
	dir, err := s.Store.SnapshotDir(img)
	if err != nil {
		return sandbox.Template{}, err
	}
	if s.Backends == nil {
		return sandbox.Template{}, fmt.Errorf("template %s: no backend to clone it on", img.Name)
	}
	be, err := s.Backends(img.Snapshot.Backend)
	if err != nil {
		// The cause names host paths (where runsc was looked for).
		return sandbox.Template{}, &sandbox.PublicError{Cause: err, Err: fmt.Errorf("%w: snapshot %s was taken on the %s backend, which this server cannot run (the server log says why)",
			sandbox.ErrInvalid, img.Name, img.Snapshot.Backend)}
	}
	return sandbox.Template{Name: img.Name, Policy: img.Snapshot.Policy, Backend: be, Snapshot: dir,
		PoolSize: s.PoolSize, Version: img.Created.String() + img.Snapshot.Dir}, nil
}

// Key is the server's API key and where it is kept.
type Key struct {
	Value string
	// From is where the key is kept: "AIRLOCK_API_KEY", or the file's
	// path; the key itself is never printed unless Generated.
	From string
	// Generated: this start made the key (and stored it in From).
	Generated bool
}

// APIKey returns the key clients must present: key, AIRLOCK_API_KEY's
// (Config.APIKey), if set, else the one stored in the state directory,
// created on first start. A key too weak to guard the server is refused
// (apikey.Check).
func APIKey(key, stateDir string) (Key, error) {
	if k := key; k != "" {
		return Key{Value: k, From: "AIRLOCK_API_KEY"}, apikey.Check("AIRLOCK_API_KEY", k)
	}
	path := filepath.Join(stateDir, "api-key")
	if data, err := os.ReadFile(path); err == nil {
		if k := strings.TrimSpace(string(data)); k != "" {
			return Key{Value: k, From: path}, apikey.Check("the API key in "+path, k)
		}
	}
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Key{}, err
	}
	k := "e2b_" + hex.EncodeToString(b[:])
	if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
		return Key{}, fmt.Errorf("store API key: %w", err)
	}
	return Key{Value: k, From: path, Generated: true}, nil
}

// TokenKey returns the secret that sandboxes' access and traffic tokens
// are derived from (sandbox.Config.TokenKey): 32 random bytes made on
// first start and kept in the state directory (token-key, mode 0600),
// so that tokens stay valid across restarts. It is not derived from the
// API key: a token, which every client of a sandbox holds, must not be
// a way to test guesses of the key offline, and rotating the key must
// not change the tokens of sandboxes that live on.
func TokenKey(stateDir string) ([]byte, error) {
	path := filepath.Join(stateDir, "token-key")
	key := make([]byte, 32)
	rand.Read(key)
	// O_EXCL: of two daemons that share the state directory and start
	// at once, one writes the key and both read it.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, err = f.WriteString(hex.EncodeToString(key) + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("store the token key: %w", err)
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("store the token key: %w", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the token key: %w", err)
	}
	key, err = hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("the token key in %s is damaged (want 64 hex digits): remove it to make a new one (sandboxes' tokens then change)", path)
	}
	return key, nil
}
