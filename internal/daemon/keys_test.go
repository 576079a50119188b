package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAPIKeyIsStoredPrivately(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "api-key")
	k, err := apiKey("", dir)
	if err != nil || !strings.HasPrefix(k.Value, "e2b_") || len(k.Value) != 44 || !k.Generated || k.From != path {
		t.Fatalf("APIKey = %+v, %v", k, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored key: %v %v, want mode 0600", fi.Mode(), err)
	}
	if again, _ := apiKey("", dir); again.Value != k.Value || again.Generated {
		t.Errorf("second start got %+v, want the stored %q, not generated", again, k.Value)
	}
	strong := "e2b_0123456789abcdef0123456789abcdef01234567"
	if k, _ := apiKey(strong, dir); k.Value != strong || k.From != "AIRLOCK_API_KEY" || k.Generated {
		t.Errorf("AIRLOCK_API_KEY ignored: %+v", k)
	}
}

// TestWeakAPIKeysRefused: a key too short to guard the server is
// refused, from the environment or from the file.
func TestWeakAPIKeysRefused(t *testing.T) {
	dir := t.TempDir()
	if _, err := apiKey("e2b_from_env", dir); err == nil || !strings.Contains(err.Error(), "AIRLOCK_API_KEY is too weak") {
		t.Errorf("a 12-character AIRLOCK_API_KEY: %v, want refused", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "api-key"), []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := apiKey("", dir); err == nil || !strings.Contains(err.Error(), "too weak") {
		t.Errorf("a weak stored key: %v, want refused", err)
	}
}

// TestTokenKey: sandboxes' tokens come from a random secret of the state
// directory, kept across starts; the API key has no part in them.
func TestTokenKey(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	k, err := tokenKey(dir)
	if err != nil || len(k) != 32 {
		t.Fatalf("TokenKey = %x, %v", k, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "token-key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored token key: %v %v, want mode 0600", fi, err)
	}
	if again, err := tokenKey(dir); err != nil || !bytes.Equal(again, k) {
		t.Errorf("a second start: %x %v, want the stored %x", again, err, k)
	}
	// Another state directory: another secret.
	if o, err := tokenKey(other); err != nil || bytes.Equal(o, k) {
		t.Errorf("another state directory's token key: %x %v, want another random one", o, err)
	}
	os.WriteFile(filepath.Join(other, "token-key"), []byte("short\n"), 0o600)
	if _, err := tokenKey(other); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("a damaged token key: %v, want refused", err)
	}
}
