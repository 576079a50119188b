package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/apikey"
)

// Key is the server's API key and where it is kept.
type Key struct {
	Value string
	// From is where the key is kept: "AIRLOCK_API_KEY", or the file's
	// path; the key itself is never printed unless Generated.
	From string
	// Generated: this start made the key (and stored it in From).
	Generated bool
}

// apiKey returns the key clients must present: key, AIRLOCK_API_KEY's
// (Config.APIKey), if set, else the one stored in the state directory,
// created on first start. A key too weak to guard the server is refused
// (apikey.Check).
func apiKey(key, stateDir string) (Key, error) {
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

// tokenKey returns the secret that sandboxes' access and traffic tokens
// are derived from (sandbox.Config.TokenKey): 32 random bytes made on
// first start and kept in the state directory (token-key, mode 0600),
// so that tokens stay valid across restarts. It is not derived from the
// API key: a token, which every client of a sandbox holds, must not be
// a way to test guesses of the key offline, and rotating the key must
// not change the tokens of sandboxes that live on.
func tokenKey(stateDir string) ([]byte, error) {
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
