package apikey

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"", false},
		{"e2b_test_key", false},
		{"secret", false},
		{strings.Repeat("a", 64), false},
		{strings.Repeat("ab", 32), false},
		{"0123456789abcdef0123456789abcde", false}, // 31
		{"0123456789abcdef0123456789abcdef", true},
		{"e2b_4a1f9c0d2b7e8a6f5c3d1e0b9a8f7c6d5e4b3a21", true},
	} {
		err := Check("AIRLOCK_API_KEY", tc.key)
		if (err == nil) != tc.ok {
			t.Errorf("Check(%q) = %v, want ok %v", tc.key, err, tc.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), "AIRLOCK_API_KEY") || !strings.Contains(err.Error(), "at least 32 characters") || strings.Contains(err.Error(), "\n")) {
			t.Errorf("Check(%q): %q should name the variable and the requirement, on one line", tc.key, err)
		}
		if err != nil && tc.key != "" && strings.Contains(err.Error(), tc.key) {
			t.Errorf("Check(%q) repeats the key: %q", tc.key, err)
		}
	}
}

func TestFingerprint(t *testing.T) {
	a, b := "0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdeF"
	fa := Fingerprint(a)
	if fa != Fingerprint(a) || fa == Fingerprint(b) {
		t.Errorf("fingerprints must be stable and differ between keys: %s %s", fa, Fingerprint(b))
	}
	if !strings.HasPrefix(fa, "sha256:") || len(fa) != len("sha256:")+8 {
		t.Errorf("Fingerprint = %q, want sha256: and 8 hex digits", fa)
	}
	if strings.Contains(fa, a[:8]) {
		t.Errorf("Fingerprint %q shows the key", fa)
	}
}
