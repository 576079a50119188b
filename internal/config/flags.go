package config

import (
	"flag"
	"fmt"
	"time"
)

// Flags are the settings a command line gives. Each flag is registered
// here, once, by the command's Register function; a field left as it
// registered it is a setting the command line does not give, which the
// environment, the config file or the default then decide (Resolve).
type Flags struct {
	// Config is the config file (--config); nil: $AIRLOCK_CONFIG.
	Config *string
	// "": not given.
	Listen, StateDir, Backend, Runsc, Domain string
	TLSCert, TLSKey                          string
	// PoolSize is every built-in template's pool (--pool-size), over
	// what the config file says; negative: not given.
	PoolSize int
	// Timeout is airlock mcp's sandboxes' time to live (--timeout); nil:
	// not given.
	Timeout *time.Duration
	// A cluster node's (serve --node-name): nil or "": not given.
	NodeName, Advertise   *string
	Kubeconfig, Namespace string
}

// ServeFlags registers airlock serve's flags on fs.
func ServeFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.Func("config", "JSON config file (default $AIRLOCK_CONFIG)", setString(&f.Config))
	fs.StringVar(&f.Listen, "listen", "", "address to listen on (default 127.0.0.1:49982)")
	fs.StringVar(&f.StateDir, "state-dir", "", "state directory (default /var/lib/airlock)")
	fs.IntVar(&f.PoolSize, "pool-size", -1, "ready sandboxes kept per template (default 2)")
	fs.StringVar(&f.Backend, "backend", "", "isolation: namespaces (default) or gvisor")
	fs.StringVar(&f.Runsc, "runsc", "", "runsc binary for the gvisor backend (default $AIRLOCK_RUNSC, then PATH)")
	fs.StringVar(&f.Domain, "domain", "", "sandboxes' servers answer at {port}-{sandboxID}.DOMAIN (default localhost:PORT)")
	fs.StringVar(&f.TLSCert, "tls-cert", "", "serve HTTPS with this PEM certificate chain, for DOMAIN and *.DOMAIN")
	fs.StringVar(&f.TLSKey, "tls-key", "", "the PEM private key of --tls-cert")
	fs.Func("node-name", "join a cluster as this node (registers with the Kubernetes API server; default $AIRLOCK_NODE_NAME)", setString(&f.NodeName))
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster's API server (default: the pod's service account)")
	fs.StringVar(&f.Namespace, "namespace", "", "namespace of Airlock's objects (default $AIRLOCK_NAMESPACE, the pod's, then airlock)")
	fs.Func("advertise", "URL at which routers reach this node (default $AIRLOCK_ADVERTISE, then http://LISTEN)", setString(&f.Advertise))
	return f
}

// MCPFlags registers airlock mcp's flags on fs. Its sandboxes are one
// client's: a pool of one, an hour to live, and no config file or
// environment to read.
func MCPFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{Timeout: new(time.Duration)}
	fs.StringVar(&f.StateDir, "state-dir", "", "state directory (default /var/lib/airlock)")
	fs.IntVar(&f.PoolSize, "pool-size", 1, "ready sandboxes kept per template")
	fs.DurationVar(f.Timeout, "timeout", time.Hour, "time to live of a session's sandbox")
	fs.StringVar(&f.Backend, "backend", "namespaces", "isolation: namespaces or gvisor")
	fs.StringVar(&f.Runsc, "runsc", "", "runsc binary for the gvisor backend (default $AIRLOCK_RUNSC, then PATH)")
	return f
}

// setString sets *p to a flag's value, even an empty one: given empty,
// such a flag overrides its environment variable.
func setString(p **string) func(string) error {
	return func(s string) error {
		*p = &s
		return nil
	}
}

// Resolve is a command's configuration: the defaults, then the config
// file, then the environment, then the flags, each over the one before.
// env looks a variable up (os.Getenv; nil: an empty environment).
//
// The one exception: $AIRLOCK_RUNSC, which the gVisor backend reads when
// neither the file nor a flag names runsc (as airlock run does).
func Resolve(env func(string) string, f *Flags) (Config, error) {
	if env == nil {
		env = func(string) string { return "" }
	}
	cfg := Default()
	// The file.
	path := env("AIRLOCK_CONFIG")
	if f.Config != nil {
		path = *f.Config
	}
	if path != "" {
		if err := Load(path, &cfg); err != nil {
			return cfg, err
		}
	}
	// The environment.
	cfg.APIKey = env("AIRLOCK_API_KEY")
	set(&cfg.Listen, env("AIRLOCK_LISTEN"))
	set(&cfg.StateDir, env("AIRLOCK_STATE_DIR"))
	set(&cfg.Stock.Root, env("AIRLOCK_STOCK_ROOT"))
	set(&cfg.Stock.Cache, env("AIRLOCK_STOCK_CACHE"))
	cfg.Node.Name, cfg.Node.Advertise = env("AIRLOCK_NODE_NAME"), env("AIRLOCK_ADVERTISE")
	// The flags.
	set(&cfg.Listen, f.Listen)
	set(&cfg.StateDir, f.StateDir)
	set(&cfg.Backend, f.Backend)
	set(&cfg.Runsc, f.Runsc)
	set(&cfg.Domain, f.Domain)
	set(&cfg.TLS.Cert, f.TLSCert)
	set(&cfg.TLS.Key, f.TLSKey)
	if f.PoolSize >= 0 {
		if cfg.Templates == nil {
			cfg.Templates = map[string]Template{}
		}
		for _, name := range Builtin {
			t, n := cfg.Templates[name], f.PoolSize
			t.PoolSize = &n
			cfg.Templates[name] = t
		}
	}
	if f.Timeout != nil {
		if *f.Timeout <= 0 {
			return cfg, fmt.Errorf("timeout must be positive")
		}
		// One client's sandboxes may live as long as it asks.
		cfg.DefaultTimeout = Duration(*f.Timeout)
		cfg.MaxTimeout = max(cfg.MaxTimeout, cfg.DefaultTimeout)
	}
	if f.NodeName != nil {
		cfg.Node.Name = *f.NodeName
	}
	if f.Advertise != nil {
		cfg.Node.Advertise = *f.Advertise
	}
	cfg.Node.Kubeconfig, cfg.Node.Namespace = f.Kubeconfig, f.Namespace
	return cfg, nil
}

// set sets *dst to v unless v is empty: an empty setting is none.
func set(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}
