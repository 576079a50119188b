package sandboxid

import (
	"regexp"
	"strings"
	"testing"
)

func TestNodePrefix(t *testing.T) {
	hex6 := regexp.MustCompile(`^[0-9a-f]{6}$`)
	a, b := NodePrefix("node-a"), NodePrefix("node-b")
	if !hex6.MatchString(a) || !hex6.MatchString(b) {
		t.Fatalf("prefixes %q %q, want six hex digits", a, b)
	}
	if a == b || NodePrefix("node-a") != a {
		t.Errorf("prefixes of two nodes %q %q: want distinct and stable", a, b)
	}
	// sha256("") begins e3b0c4: the prefix is the digest's first three bytes.
	if got := NodePrefix(""); got != "e3b0c4" {
		t.Errorf("NodePrefix(\"\") = %q, want e3b0c4", got)
	}
}

func TestNodeOf(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"iabcdef0123456789abc", "abcdef"},
		{"i" + NodePrefix("n") + "0123456789abc", NodePrefix("n")},
		{"iABCDEF0123456789abc", "ABCDEF"}, // hex either case, as DecodeString reads it
		{"xabcdef0123456789abc", ""},       // not an id's first letter
		{"iabcdef0123456789ab", ""},        // too short
		{"iabcdef0123456789abcd", ""},      // too long
		{"iabcdeg0123456789abc", ""},       // not hex
		{"", ""},
	} {
		if got := NodeOf(tc.id); got != tc.want {
			t.Errorf("NodeOf(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}

func TestParseHost(t *testing.T) {
	for _, tc := range []struct {
		host, domain string
		port, id     string
		ok           bool
	}{
		{"49983-iabc.e2b.local", "e2b.local", "49983", "iabc", true},
		{"3000-IABC.E2B.Local", "e2b.local", "3000", "iabc", true},
		{"3000-iabc.e2b.local:8080", "e2b.local", "3000", "iabc", true},
		{"3000-iabc.e2b.local", "E2B.local:443", "3000", "iabc", true},
		{"3000-iabc-x.e2b.local", "e2b.local", "3000", "iabc-x", true},
		{"3000-iabc.other.local", "e2b.local", "", "", false},
		{"3000-iabc.sub.e2b.local", "e2b.local", "", "", false},
		{"e2b.local", "e2b.local", "", "", false},
		{"iabc.e2b.local", "e2b.local", "", "", false},
		{"-iabc.e2b.local", "e2b.local", "", "", false},
		{"3000-.e2b.local", "e2b.local", "", "", false},
		{"30a0-iabc.e2b.local", "e2b.local", "", "", false},
		{"3000-iabc.e2b.local", "", "", "", false},
		{"localhost", "e2b.local", "", "", false},
		{"", "e2b.local", "", "", false},
	} {
		port, id, ok := ParseHost(tc.host, tc.domain)
		if port != tc.port || id != tc.id || ok != tc.ok {
			t.Errorf("ParseHost(%q, %q) = %q, %q, %v; want %q, %q, %v", tc.host, tc.domain, port, id, ok, tc.port, tc.id, tc.ok)
		}
	}
}

// Whatever a client sends as a Host, ParseHost neither panics nor
// returns a port that is not digits or an id with a dot.
func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"49983-iabc.e2b.local", "3000-iabc.e2b.local:80", "-.", "a-b.c:d:e", "[::1]:80"} {
		f.Add(s, "e2b.local")
	}
	digits := regexp.MustCompile(`^[0-9]+$`)
	f.Fuzz(func(t *testing.T, host, domain string) {
		port, id, ok := ParseHost(host, domain)
		if !ok {
			if port != "" || id != "" {
				t.Errorf("not ok, yet %q %q", port, id)
			}
			return
		}
		if !digits.MatchString(port) || id == "" || strings.Contains(id, ".") {
			t.Errorf("ParseHost(%q, %q) = %q, %q", host, domain, port, id)
		}
	})
}

func TestNewIsValid(t *testing.T) {
	for _, prefix := range []string{"", "abc123", "0123456789abcdef012"} {
		id := New(prefix)
		if !Valid(id) || !strings.HasPrefix(id, "i"+prefix) || len(id) != 20 {
			t.Errorf("New(%q) = %q: not a valid id of that prefix", prefix, id)
		}
	}
	for _, bad := range []string{"", "i", "iABCDEF0123456789abc", "x0123456789abcdef012", "i0123456789abcdef01", "i0123456789abcdef0123", "i0123456789abcdef01g"} {
		if Valid(bad) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}
}
