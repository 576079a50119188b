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
