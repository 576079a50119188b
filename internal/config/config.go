// Package config is the daemon's configuration: its JSON schema, its
// defaults, the commands' flags, and the precedence of defaults, config
// file, environment and flags (Resolve). It knows no other part of the
// daemon: package daemon makes a daemon of a Config.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
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
	Domain string `json:"domain"`
	// TLS serves the API and sandboxes' servers over HTTPS, as E2B does,
	// with a certificate for the domain and its wildcard.
	TLS     TLS     `json:"tls"`
	Network Network `json:"network"`
	Builds  Builds  `json:"builds"`
	// MetricsInterval: how often sandboxes are measured for getMetrics'
	// history (default 5s; an hour of samples is kept).
	MetricsInterval Duration `json:"metricsInterval"`
	// PauseInMemory: a pause freezes a sandbox in memory (fast, but it
	// keeps its RAM and dies with the daemon) even where its backend can
	// save it to disk (gVisor, without a network).
	PauseInMemory bool `json:"pauseInMemory"`
	// LiveRestore: sandboxes outlive the daemon (a restart, a kill, a new
	// binary), and the next start takes them back. Off by
	// default: without a daemon nothing ends them at their time to live
	// and their networks reach nothing.
	LiveRestore bool `json:"liveRestore"`
	// TemplatePoolSize is how many ready sandboxes a template made from
	// an image with a start command keeps, once it was first asked for
	// (default 1; 0: none).
	TemplatePoolSize *int `json:"templatePoolSize"`
	// MaxConnections bounds the connections the API's listener holds at
	// once (0: 4096; more wait until one closes), and IdleTimeout closes
	// a keep-alive connection idle that long between requests (0: 2m).
	MaxConnections int      `json:"maxConnections"`
	IdleTimeout    Duration `json:"idleTimeout"`
	// Stock is what base and code-interpreter-v1 run on.
	Stock Stock `json:"stock"`
	// Volumes are E2B's volumes (Volume.create): each an ext4 file
	// system of Size (default 1G), its space reserved on the host's disk
	// when it is made.
	Volumes Volumes `json:"volumes"`
	// Audit is the sandboxes' audit trails (GET /sandboxes/{id}/audit).
	Audit Audit `json:"audit"`

	// What no config file holds. APIKey is the key clients must present
	// ($AIRLOCK_API_KEY); "": the one kept in the state directory.
	APIKey string `json:"-"`
	// Node makes the daemon a node of a cluster.
	Node Node `json:"-"`
}

// Audit configures the sandboxes' audit trails: each holds at most
// MaxSize (default 4M) of events, and outlives its sandbox by Retention
// (default 24h).
type Audit struct {
	MaxSize   Size     `json:"maxSize"`
	Retention Duration `json:"retention"`
}

// Volumes configures E2B's volumes.
type Volumes struct {
	Size Size `json:"size"`
}

// TLS is the certificate the daemon serves HTTPS with: PEM files of the
// chain and its key ("": plain HTTP).
type TLS struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
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

// Network is what the server offers sandboxes that ask for a network.
type Network struct {
	// Default is what a sandbox created through the E2B API that says
	// nothing of its network gets: NetInternet (E2B's rule, the default)
	// or NetNone, which seals the server: no sandbox gets the internet,
	// and a request for it is refused, naming this setting. airlock run
	// and MCP give no network by default whatever it says.
	Default NetDefault `json:"default"`
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
	// Budget is the bytes a sandbox's connections may carry in its life,
	// both ways together (0: no budget); past it its egress ends, and
	// its audit trail says why.
	Budget Size `json:"budget"`
}

// Stock is the root of the stock templates, base and
// code-interpreter-v1.
type Stock struct {
	// Root: "debian" (the default), a Debian root with root and sudo
	// inside, as E2B's machines, made with debootstrap from the host's
	// apt sources at the first start that finds none in Cache (minutes,
	// once; `airlock template stock` makes it beforehand); or "jail", the
	// host's /usr read-only, as the jail template.
	Root string `json:"root"`
	// Cache keeps made roots, one per package list and Debian release;
	// a host's daemons share its roots, read-only.
	Cache string `json:"cache"`
}

// DefaultStockCache is where stock roots are kept unless the config says
// otherwise: a cache of the host's, not a daemon's state, so that every
// daemon on the host (and make test's) finds the root made once.
const DefaultStockCache = "/var/cache/airlock/stock"

// The stock roots.
const (
	StockJail   = "jail"
	StockDebian = "debian"
)

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

// NetDefault is network.default: NetInternet or NetNone.
type NetDefault string

// The values of network.default ("": NetInternet).
const (
	NetInternet NetDefault = "internet"
	NetNone     NetDefault = "none"
)

func (n *NetDefault) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil || (s != string(NetInternet) && s != string(NetNone)) {
		return fmt.Errorf("network.default %s: want \"internet\" or \"none\"", b)
	}
	*n = NetDefault(s)
	return nil
}

// Sealed reports whether the server is sealed: no internet for any
// sandbox.
func (n Network) Sealed() bool { return n.Default == NetNone }

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

// Jail is the template of the host's /usr, read-only, as user only: the
// smallest and fastest sandbox.
const Jail = "jail"

// Builtin are the templates every server has.
var Builtin = []string{"base", CodeInterpreter, Jail}

// Default is the configuration of a server started without one.
func Default() Config {
	return Config{
		Listen:           "127.0.0.1:49982",
		StateDir:         "/var/lib/airlock",
		Stock:            Stock{Root: StockDebian, Cache: DefaultStockCache},
		DefaultTimeout:   Duration(300 * time.Second),
		MaxTimeout:       Duration(24 * time.Hour),
		PoolMemoryBudget: Size(1 << 30),
		Volumes:          Volumes{Size: Size(1 << 30)},
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
