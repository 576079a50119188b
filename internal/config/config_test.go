package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
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
	mc, err := Manager(&cfg, noBackend)
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
			if _, err := Manager(&cfg, noBackend); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestAPIKeyIsStoredPrivately(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "api-key")
	k, err := APIKey("", dir)
	if err != nil || !strings.HasPrefix(k.Value, "e2b_") || len(k.Value) != 44 || !k.Generated || k.From != path {
		t.Fatalf("APIKey = %+v, %v", k, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored key: %v %v, want mode 0600", fi.Mode(), err)
	}
	if again, _ := APIKey("", dir); again.Value != k.Value || again.Generated {
		t.Errorf("second start got %+v, want the stored %q, not generated", again, k.Value)
	}
	strong := "e2b_0123456789abcdef0123456789abcdef01234567"
	if k, _ := APIKey(strong, dir); k.Value != strong || k.From != "AIRLOCK_API_KEY" || k.Generated {
		t.Errorf("AIRLOCK_API_KEY ignored: %+v", k)
	}
}

// TestWeakAPIKeysRefused: a key too short to guard the server is
// refused, from the environment or from the file.
func TestWeakAPIKeysRefused(t *testing.T) {
	dir := t.TempDir()
	if _, err := APIKey("e2b_from_env", dir); err == nil || !strings.Contains(err.Error(), "AIRLOCK_API_KEY is too weak") {
		t.Errorf("a 12-character AIRLOCK_API_KEY: %v, want refused", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "api-key"), []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := APIKey("", dir); err == nil || !strings.Contains(err.Error(), "too weak") {
		t.Errorf("a weak stored key: %v, want refused", err)
	}
}

// TestTokenKey: sandboxes' tokens come from a random secret of the state
// directory, kept across starts, whatever the API key.
func TestTokenKey(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	t.Setenv("AIRLOCK_API_KEY", "e2b_0123456789abcdef0123456789abcdef01234567")
	k, err := TokenKey(dir)
	if err != nil || len(k) != 32 {
		t.Fatalf("TokenKey = %x, %v", k, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "token-key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored token key: %v %v, want mode 0600", fi, err)
	}
	t.Setenv("AIRLOCK_API_KEY", "e2b_fedcba9876543210fedcba9876543210fedcba98")
	if again, err := TokenKey(dir); err != nil || !bytes.Equal(again, k) {
		t.Errorf("after the API key changed: %x %v, want the stored %x", again, err, k)
	}
	// Same API key, another state directory: another secret.
	if o, err := TokenKey(other); err != nil || bytes.Equal(o, k) {
		t.Errorf("another state directory's token key: %x %v, want another random one", o, err)
	}
	os.WriteFile(filepath.Join(other, "token-key"), []byte("short\n"), 0o600)
	if _, err := TokenKey(other); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("a damaged token key: %v, want refused", err)
	}
}

func TestNetworkRates(t *testing.T) {
	cfg := Default()
	cfg.Network.DNSRate, cfg.Network.ConnectionRate = "20/m", "5/h"
	n, err := NetworkHost(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := (netpolicy.Rate{N: 20, Per: time.Minute, Burst: 40}); n.Limits.DNSRate != want {
		t.Errorf("dnsRate 20/m read as %+v, want %+v", n.Limits.DNSRate, want)
	}
	if want := (netpolicy.Rate{N: 5, Per: time.Hour, Burst: 10}); n.Limits.ConnectionRate != want {
		t.Errorf("connectionRate 5/h read as %+v, want %+v", n.Limits.ConnectionRate, want)
	}
	for _, bad := range []string{"100", "0/s", "-1/s", "10/d", "x/s", "10/"} {
		cfg.Network.DNSRate = bad
		if _, err := NetworkHost(&cfg); err == nil || !strings.Contains(err.Error(), "network.dnsRate") {
			t.Errorf("dnsRate %q: %v, want an error naming network.dnsRate", bad, err)
		}
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
