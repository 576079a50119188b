package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func noBackend(name string) (sandbox.Backend, error) { return nil, nil }

func TestLoadRefusesUnknownFields(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"unknown field", `{"listen": "127.0.0.1:1", "maxSandbox": 3}`, `unknown field "maxSandbox"`},
		{"bad duration", `{"defaultTimeout": "soon"}`, `invalid duration "soon"`},
		{"bad size", `{"poolMemoryBudget": "lots"}`, "lots"},
		{"not JSON", `listen: x`, "invalid character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "airlock.json")
			os.WriteFile(path, []byte(tc.file), 0o600)
			cfg := Default()
			err := Load(path, &cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load(%s) = %v, want an error naming %q", tc.file, err, tc.want)
			}
		})
	}
	dir := t.TempDir()
	if err := Load(filepath.Join(dir, "missing.json"), new(Config)); err == nil || strings.Contains(err.Error(), dir) {
		t.Errorf("missing file: %v, want an error without the path", err)
	}
}

func TestManager(t *testing.T) {
	path := filepath.Join(t.TempDir(), "airlock.json")
	os.WriteFile(path, []byte(`{"defaultTimeout": "60s", "maxTimeout": "1h", "maxSandboxes": 7,
		"templates": {"base": {"memory": "256M", "pids": 64, "cpus": 0.5, "disk": "128M", "poolSize": 3}}}`), 0o600)
	cfg := Default()
	if err := Load(path, &cfg); err != nil {
		t.Fatal(err)
	}
	mc, err := Manager(&cfg, -1, noBackend)
	if err != nil {
		t.Fatal(err)
	}
	if mc.DefaultTTL != time.Minute || mc.MaxTTL != time.Hour || mc.MaxSandboxes != 7 || len(mc.Templates) != len(Builtin) {
		t.Fatalf("manager config %+v", mc)
	}
	base, ci := mc.Templates[0], mc.Templates[1]
	if p := base.Policy; base.Name != "base" || base.PoolSize != 3 || p.MemoryBytes != 256<<20 || p.Pids != 64 || p.CPUs != 0.5 || p.DiskBytes != 128<<20 {
		t.Errorf("base template %+v", base)
	}
	if ci.Name != CodeInterpreter || ci.PoolSize != 2 || !strings.Contains(strings.Join(ci.Policy.Env, " "), agentproto.PrestartEnv+"=python") {
		t.Errorf("code interpreter template %+v, want the default pool and a prestarted Python kernel", ci)
	}
	// A flag's pool size wins over the file's.
	if mc, _ := Manager(&cfg, 0, noBackend); mc.Templates[0].PoolSize != 0 || mc.Templates[1].PoolSize != 0 {
		t.Errorf("--pool-size 0 left pools of %d and %d", mc.Templates[0].PoolSize, mc.Templates[1].PoolSize)
	}
}

func TestManagerRefusesBadConfigs(t *testing.T) {
	pids := int64(0)
	pool := 1001
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		want string
	}{
		{"unknown template", func(c *Config) { c.Templates = map[string]Template{"gpu": {}} }, `unknown template "gpu"`},
		{"default above max", func(c *Config) { c.DefaultTimeout = c.MaxTimeout + 1 }, "at most maxTimeout"},
		{"zero default", func(c *Config) { c.DefaultTimeout = 0 }, "must be positive"},
		{"bad limit", func(c *Config) { c.Templates = map[string]Template{"base": {Pids: &pids}} }, "template base"},
		{"pool too large", func(c *Config) { c.Templates = map[string]Template{"base": {PoolSize: &pool}} }, "pool size 1001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			tc.cfg(&cfg)
			if _, err := Manager(&cfg, -1, noBackend); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestAPIKeyIsStoredPrivately(t *testing.T) {
	t.Setenv("AIRLOCK_API_KEY", "")
	dir := t.TempDir()
	k, err := APIKey(dir)
	if err != nil || !strings.HasPrefix(k, "e2b_") || len(k) != 44 {
		t.Fatalf("APIKey = %q, %v", k, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "api-key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored key: %v %v, want mode 0600", fi.Mode(), err)
	}
	if again, _ := APIKey(dir); again != k {
		t.Errorf("second start got key %q, want the stored %q", again, k)
	}
	t.Setenv("AIRLOCK_API_KEY", "e2b_from_env")
	if k, _ := APIKey(dir); k != "e2b_from_env" {
		t.Errorf("AIRLOCK_API_KEY ignored: %q", k)
	}
}

func TestBuildsRegistryAddresses(t *testing.T) {
	b := Builds{PrivateRegistries: true, RegistryAddresses: []string{"127.0.0.1", "10.1.2.3/16", "::1", "fd00::1/64"}}
	r, err := b.Pulls()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.Allow {
		got = append(got, p.String())
	}
	if want := "127.0.0.1/32 10.1.0.0/16 ::1/128 fd00::/64"; strings.Join(got, " ") != want || !r.Private {
		t.Errorf("pulls: %v (private %v), want %s", got, r.Private, want)
	}
	for _, bad := range []string{"registry.local", "10.0.0.0/33", "fe80::1%eth0", ""} {
		_, _, err := BuildSettings(&Config{Builds: Builds{RegistryAddresses: []string{bad}}})
		if err == nil || !strings.Contains(err.Error(), "builds.registryAddresses") || strings.Contains(err.Error(), "\n") {
			t.Errorf("registryAddresses %q: %v, want one line naming builds.registryAddresses", bad, err)
		}
	}
}
