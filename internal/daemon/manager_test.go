package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func noBackend(name string) (sandbox.Backend, error) { return nil, nil }

func TestManager(t *testing.T) {
	path := filepath.Join(t.TempDir(), "airlock.json")
	os.WriteFile(path, []byte(`{"defaultTimeout": "60s", "maxTimeout": "1h", "maxSandboxes": 7,
		"templates": {"base": {"memory": "256M", "pids": 64, "cpus": 0.5, "disk": "128M", "poolSize": 3}}}`), 0o600)
	cfg := config.Default()
	if err := config.Load(path, &cfg); err != nil {
		t.Fatal(err)
	}
	mc, err := managerConfig(&cfg, noBackend)
	if err != nil {
		t.Fatal(err)
	}
	if mc.DefaultTTL != time.Minute || mc.MaxTTL != time.Hour || mc.MaxSandboxes != 7 || len(mc.Templates) != len(config.Builtin) {
		t.Fatalf("manager config %+v", mc)
	}
	base, ci := mc.Templates[0], mc.Templates[1]
	if p := base.Policy; base.Name != "base" || base.PoolSize != 3 || p.MemoryBytes != 256<<20 || p.Pids != 64 || p.CPUs != 0.5 || p.DiskBytes != 128<<20 {
		t.Errorf("base template %+v", base)
	}
	if ci.Name != config.CodeInterpreter || ci.PoolSize != 2 || !strings.Contains(strings.Join(ci.Policy.Env, " "), agentproto.PrestartEnv+"=python") {
		t.Errorf("code interpreter template %+v, want the default pool and a prestarted Python kernel", ci)
	}
	// On the default (Debian) stock root the jail keeps a pool of its own.
	if jail := mc.Templates[2]; jail.Name != config.Jail || jail.PoolSize != 2 || jail.Policy.Root || len(jail.Policy.RootLayers) != 0 {
		t.Errorf("jail template %+v, want the host's /usr, as user, with a pool of its own", jail)
	}
	// With the jail as the stock root, the jail is base, which is pooled.
	cfg.Stock.Root = config.StockJail
	if mc, err = managerConfig(&cfg, noBackend); err != nil || mc.Templates[2].PoolSize != 0 {
		t.Errorf("with the jail as the stock root, the jail has no pool of its own: %+v, %v", mc.Templates[2], err)
	}
}

func TestCheckStock(t *testing.T) {
	for _, tc := range []struct {
		stock config.Stock
		want  string
	}{
		{config.Stock{}, ""},
		{config.Stock{Root: "jail"}, ""},
		{config.Stock{Root: "debian", Cache: "/var/cache/airlock/stock"}, ""},
		{config.Stock{Root: "ubuntu"}, `stock.root "ubuntu": want "jail" or "debian"`},
		{config.Stock{Root: "debian", Cache: "cache"}, `stock.cache "cache" is not an absolute path`},
	} {
		err := checkStock(tc.stock)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || err.Error() != tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.stock, err, tc.want)
		}
	}
}

func TestManagerRefusesBadConfigs(t *testing.T) {
	pids := int64(0)
	pool := 1001
	for _, tc := range []struct {
		name string
		cfg  func(*config.Config)
		want string
	}{
		{"unknown template", func(c *config.Config) { c.Templates = map[string]config.Template{"gpu": {}} }, `unknown template "gpu"`},
		{"default above max", func(c *config.Config) { c.DefaultTimeout = c.MaxTimeout + 1 }, "at most maxTimeout"},
		{"zero default", func(c *config.Config) { c.DefaultTimeout = 0 }, "must be positive"},
		{"bad limit", func(c *config.Config) { c.Templates = map[string]config.Template{"base": {Pids: &pids}} }, "template base"},
		{"pool too large", func(c *config.Config) { c.Templates = map[string]config.Template{"base": {PoolSize: &pool}} }, "pool size 1001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			tc.cfg(&cfg)
			if _, err := managerConfig(&cfg, noBackend); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
