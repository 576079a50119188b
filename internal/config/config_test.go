package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadRefusesUnknownFields(t *testing.T) {
	for _, tc := range []struct{ name, file, want string }{
		{"unknown field", `{"listen": "127.0.0.1:1", "maxSandbox": 3}`, `unknown field "maxSandbox"`},
		{"bad duration", `{"defaultTimeout": "soon"}`, `invalid duration "soon"`},
		{"bad size", `{"poolMemoryBudget": "lots"}`, "lots"},
		{"not JSON", `listen: x`, "invalid character"},
		{"bad network default", `{"network": {"default": "sealed"}}`, `network.default "sealed": want "internet" or "none"`},
		{"network default not a string", `{"network": {"default": false}}`, `network.default false`},
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

func TestNetworkDefault(t *testing.T) {
	for _, tc := range []struct {
		file   string
		sealed bool
	}{
		{`{}`, false},
		{`{"network": {"default": "internet"}}`, false},
		{`{"network": {"default": "none"}}`, true},
	} {
		path := filepath.Join(t.TempDir(), "airlock.json")
		os.WriteFile(path, []byte(tc.file), 0o600)
		cfg := Default()
		if err := Load(path, &cfg); err != nil {
			t.Fatalf("Load(%s): %v", tc.file, err)
		}
		if got := cfg.Network.Sealed(); got != tc.sealed {
			t.Errorf("%s: Sealed() = %v, want %v", tc.file, got, tc.sealed)
		}
	}
}
