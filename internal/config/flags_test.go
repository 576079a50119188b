package config

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// settings are the parts of c that the command line, the environment or
// the file can set, by name.
func settings(c Config) map[string]string {
	pool := func(name string) string {
		if p := c.Templates[name].PoolSize; p != nil {
			return strconv.Itoa(*p)
		}
		return "-"
	}
	return map[string]string{
		"listen": c.Listen, "stateDir": c.StateDir, "backend": c.Backend, "runsc": c.Runsc, "domain": c.Domain,
		"apiKey": c.APIKey, "maxSandboxes": strconv.Itoa(c.MaxSandboxes),
		"pool.base": pool("base"), "pool.ci": pool(CodeInterpreter),
		"defaultTimeout": time.Duration(c.DefaultTimeout).String(), "maxTimeout": time.Duration(c.MaxTimeout).String(),
		"node": c.Node.Name, "advertise": c.Node.Advertise, "kubeconfig": c.Node.Kubeconfig, "namespace": c.Node.Namespace,
	}
}

// TestResolvePrecedence: defaults < config file < environment < flags,
// setting by setting, for airlock serve and airlock mcp.
func TestResolvePrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "airlock.json")
	other := filepath.Join(dir, "other.json")
	os.WriteFile(file, []byte(`{"listen": "127.0.0.2:1", "stateDir": "/file", "backend": "gvisor", "runsc": "/file/runsc",
		"domain": "file.test", "maxSandboxes": 3, "templates": {"base": {"poolSize": 3}}}`), 0o600)
	os.WriteFile(other, []byte(`{"maxSandboxes": 5}`), 0o600)
	for _, tc := range []struct {
		name string
		mcp  bool // airlock mcp's flags, and no environment
		env  map[string]string
		args []string
		want map[string]string
	}{
		{name: "defaults", want: map[string]string{"listen": "127.0.0.1:49982", "stateDir": "/var/lib/airlock", "backend": "",
			"runsc": "", "domain": "", "apiKey": "", "maxSandboxes": "0", "pool.base": "-", "pool.ci": "-",
			"defaultTimeout": "5m0s", "maxTimeout": "24h0m0s", "node": ""}},
		{name: "file over defaults", args: []string{"--config", file}, want: map[string]string{"listen": "127.0.0.2:1",
			"stateDir": "/file", "backend": "gvisor", "runsc": "/file/runsc", "domain": "file.test", "maxSandboxes": "3",
			"pool.base": "3", "pool.ci": "-", "defaultTimeout": "5m0s"}},
		{name: "AIRLOCK_CONFIG names the file", env: map[string]string{"AIRLOCK_CONFIG": file}, want: map[string]string{"maxSandboxes": "3"}},
		{name: "--config over AIRLOCK_CONFIG", env: map[string]string{"AIRLOCK_CONFIG": file}, args: []string{"--config", other},
			want: map[string]string{"maxSandboxes": "5", "listen": "127.0.0.1:49982"}},
		{name: "--config empty: no file", env: map[string]string{"AIRLOCK_CONFIG": file}, args: []string{"--config", ""},
			want: map[string]string{"maxSandboxes": "0"}},
		{name: "environment over file", env: map[string]string{"AIRLOCK_LISTEN": "127.0.0.3:1", "AIRLOCK_STATE_DIR": "/env"},
			args: []string{"--config", file}, want: map[string]string{"listen": "127.0.0.3:1", "stateDir": "/env", "backend": "gvisor"}},
		{name: "flags over environment and file", env: map[string]string{"AIRLOCK_LISTEN": "127.0.0.3:1", "AIRLOCK_STATE_DIR": "/env"},
			args: []string{"--config", file, "--listen", "127.0.0.4:1", "--state-dir", "/flag", "--backend", "namespaces",
				"--runsc", "/flag/runsc", "--domain", "flag.test"},
			want: map[string]string{"listen": "127.0.0.4:1", "stateDir": "/flag", "backend": "namespaces", "runsc": "/flag/runsc", "domain": "flag.test"}},
		{name: "an empty flag is none", env: map[string]string{"AIRLOCK_LISTEN": "127.0.0.3:1"},
			args: []string{"--config", file, "--listen", "", "--state-dir", "", "--backend", ""},
			want: map[string]string{"listen": "127.0.0.3:1", "stateDir": "/file", "backend": "gvisor"}},
		{name: "--pool-size over every template's", args: []string{"--config", file, "--pool-size", "0"},
			want: map[string]string{"pool.base": "0", "pool.ci": "0"}},
		{name: "a negative --pool-size is none", args: []string{"--config", file, "--pool-size", "-4"},
			want: map[string]string{"pool.base": "3", "pool.ci": "-"}},
		{name: "the API key from the environment", env: map[string]string{"AIRLOCK_API_KEY": "e2b_k"}, want: map[string]string{"apiKey": "e2b_k"}},
		{name: "node from the environment", env: map[string]string{"AIRLOCK_NODE_NAME": "n1", "AIRLOCK_ADVERTISE": "http://10.0.0.1:1"},
			want: map[string]string{"node": "n1", "advertise": "http://10.0.0.1:1"}},
		{name: "node flags over the environment", env: map[string]string{"AIRLOCK_NODE_NAME": "n1", "AIRLOCK_ADVERTISE": "http://10.0.0.1:1"},
			args: []string{"--node-name", "n2", "--advertise", "http://10.0.0.2:1", "--kubeconfig", "/k", "--namespace", "ns"},
			want: map[string]string{"node": "n2", "advertise": "http://10.0.0.2:1", "kubeconfig": "/k", "namespace": "ns"}},
		{name: "an empty --node-name is no node", env: map[string]string{"AIRLOCK_NODE_NAME": "n1", "AIRLOCK_ADVERTISE": "http://10.0.0.1:1"},
			args: []string{"--node-name", "", "--advertise", ""}, want: map[string]string{"node": "", "advertise": ""}},
		{name: "mcp defaults", mcp: true, want: map[string]string{"stateDir": "/var/lib/airlock", "backend": "namespaces",
			"pool.base": "1", "pool.ci": "1", "defaultTimeout": "1h0m0s", "maxTimeout": "24h0m0s"}},
		{name: "mcp reads no environment", mcp: true, env: map[string]string{"AIRLOCK_STATE_DIR": "/env", "AIRLOCK_CONFIG": file, "AIRLOCK_API_KEY": "e2b_k"},
			want: map[string]string{"stateDir": "/var/lib/airlock", "maxSandboxes": "0", "apiKey": ""}},
		{name: "mcp flags", mcp: true, args: []string{"--state-dir", "/flag", "--pool-size", "0", "--backend", "gvisor", "--runsc", "/r"},
			want: map[string]string{"stateDir": "/flag", "pool.base": "0", "pool.ci": "0", "backend": "gvisor", "runsc": "/r"}},
		{name: "mcp --timeout above the maximum raises it", mcp: true, args: []string{"--timeout", "48h"},
			want: map[string]string{"defaultTimeout": "48h0m0s", "maxTimeout": "48h0m0s"}},
		{name: "mcp --timeout below the maximum keeps it", mcp: true, args: []string{"--timeout", "1m"},
			want: map[string]string{"defaultTimeout": "1m0s", "maxTimeout": "24h0m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := resolveArgs(tc.mcp, tc.env, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			got := settings(cfg)
			for k, want := range tc.want {
				if got[k] != want {
					t.Errorf("%s = %q, want %q", k, got[k], want)
				}
			}
		})
	}
}

// resolveArgs parses args as airlock serve's command line (airlock mcp's)
// and resolves them over env.
func resolveArgs(mcp bool, env map[string]string, args []string) (Config, error) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	register, getenv := ServeFlags, func(k string) string { return env[k] }
	if mcp {
		register, getenv = MCPFlags, nil
	}
	f := register(fs)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	return Resolve(getenv, f)
}

func TestResolveRefuses(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"listne": "x"}`), 0o600)
	for _, tc := range []struct {
		mcp  bool
		env  map[string]string
		args []string
		want string
	}{
		{args: []string{"--config", bad}, want: `unknown field "listne"`},
		{env: map[string]string{"AIRLOCK_CONFIG": bad}, want: `unknown field "listne"`},
		{args: []string{"--config", filepath.Join(dir, "missing.json")}, want: "config file: no such file or directory"},
		{args: []string{"--pool-size", "many"}, want: `invalid value "many" for flag -pool-size`},
		{args: []string{"--timeout", "1h"}, want: "flag provided but not defined: -timeout"},
		{mcp: true, args: []string{"--timeout", "0s"}, want: "timeout must be positive"},
		{mcp: true, args: []string{"--timeout", "-1m"}, want: "timeout must be positive"},
		{mcp: true, args: []string{"--config", bad}, want: "flag provided but not defined: -config"},
		{mcp: true, args: []string{"--listen", "127.0.0.1:1"}, want: "flag provided but not defined: -listen"},
	} {
		_, err := resolveArgs(tc.mcp, tc.env, tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("mcp %v, %v, %v: %v, want one line naming %q", tc.mcp, tc.env, tc.args, err, tc.want)
		}
	}
}

// TestFileSettingsNotInTheFile: the settings that only the environment
// or flags give are no keys of the config file.
func TestFileSettingsNotInTheFile(t *testing.T) {
	for _, key := range []string{"apiKey", "APIKey", "node", "Node"} {
		path := filepath.Join(t.TempDir(), "airlock.json")
		os.WriteFile(path, []byte(`{"`+key+`": "x"}`), 0o600)
		cfg := Default()
		if err := Load(path, &cfg); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("a config file with %q: %v, want the key refused", key, err)
		}
	}
}
