package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" with an error mentioning errWant
		errWant  string
	}{
		{in: "203.0.113.7", want: "203.0.113.7"},
		{in: "203.0.113.0/24", want: "203.0.113.0/24"},
		{in: "203.0.113.9/24", want: "203.0.113.0/24"}, // masked
		{in: "0.0.0.0/0", want: "0.0.0.0/0"},
		{in: "::ffff:203.0.113.7", want: "203.0.113.7"},
		{in: "Example.COM.", want: "example.com"},
		{in: "*.example.com", want: "*.example.com"},
		{in: "under_score.example", want: "under_score.example"},
		{in: "localhost", want: "localhost"},
		{in: "", errWant: "empty"},
		{in: "::/0", errWant: "IPv6"},
		{in: "2001:db8::1", errWant: "IPv6"},
		{in: "10.0.0.300", errWant: "not a valid address"},
		{in: "10.0.0", errWant: "not a valid address"},
		{in: "example.com:443", errWant: "not a valid address"},
		{in: "*", errWant: "character"},
		{in: "a.*.example.com", errWant: "character"},
		{in: "exa mple.com", errWant: "character"},
		{in: "a..b", errWant: "label"},
		{in: strings.Repeat("a", 64) + ".com", errWant: "label"},
		{in: strings.Repeat("a.", 130) + "com", errWant: "253"},
	} {
		r, err := ParseRule(tc.in)
		switch {
		case tc.errWant != "":
			if err == nil || !strings.Contains(err.Error(), tc.errWant) {
				t.Errorf("ParseRule(%q) = %v, %v; want an error mentioning %q", tc.in, r, err, tc.errWant)
			}
		case err != nil:
			t.Errorf("ParseRule(%q): %v", tc.in, err)
		case r.String() != tc.want:
			t.Errorf("ParseRule(%q) = %s, want %s", tc.in, r, tc.want)
		}
	}
}

func TestRuleMatch(t *testing.T) {
	mustRule := func(s string) Rule {
		r, err := ParseRule(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	wild, exact, cidr := mustRule("*.example.com"), mustRule("example.com"), mustRule("198.51.100.0/24")
	for _, tc := range []struct {
		r    Rule
		name string
		want bool
	}{
		{wild, "a.example.com", true},
		{wild, "a.b.example.com", true},
		{wild, "example.com", false},
		{wild, "badexample.com", false},
		{exact, "example.com", true},
		{exact, "a.example.com", false},
		{cidr, "198.51.100.7", false}, // a name never matches an address rule
	} {
		if got := tc.r.MatchName(tc.name); got != tc.want {
			t.Errorf("%s matches name %s: %v, want %v", tc.r, tc.name, got, tc.want)
		}
	}
	if !cidr.MatchAddr(netip.MustParseAddr("198.51.100.7")) || cidr.MatchAddr(netip.MustParseAddr("198.51.101.7")) {
		t.Error("address rule matches wrongly")
	}
	if exact.MatchAddr(netip.MustParseAddr("198.51.100.7")) {
		t.Error("a name rule matched an address")
	}
}

func TestNetworkValidate(t *testing.T) {
	r, _ := ParseRule("example.com")
	for _, tc := range []struct {
		n    Network
		want string
	}{
		{Network{}, ""},
		{Network{Mode: NetFiltered}, ""},
		{Network{Mode: NetInternet, DenyOut: []Rule{r}}, ""},
		{Network{AllowOut: []Rule{r}}, "need a network"},
		{Network{Mode: "wifi"}, "unknown network mode"},
		{Network{Mode: NetFiltered, AllowOut: []Rule{{}}}, "either a prefix or a name"},
		{Network{Mode: NetFiltered, AllowOut: make([]Rule, maxRules+1)}, "at most"},
	} {
		err := tc.n.Validate()
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.n, err, tc.want)
		}
	}
}

// FuzzParseRule: no input crashes the parser, and what it accepts reads
// back as itself.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"203.0.113.7", "10.0.0.0/8", "*.example.com", "example.com.", "::/0", "a..b", "1.2.3.4/33"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		again, err := ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRule(%q) = %v, which reads back as %v, %v", s, r, again, err)
		}
	})
}

func TestPublic(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"8.8.8.8", true},
		{"169.254.169.254", false},
		{"10.1.2.3", false},
		{"::ffff:127.0.0.1", false},
		{"2606:4700::1111", true},
		{"fd00::1", false},
		{"fe80::1", false},
		{"::1", false},
		// IPv4 carried in IPv6 is judged by the IPv4 address.
		{"64:ff9b::a9fe:a9fe", false},  // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", true},     // NAT64 of 8.8.8.8
		{"2002:7f00:1::1", false},      // 6to4 of 127.0.0.1
		{"2002:a00:1::1", false},       // 6to4 of 10.0.0.1
		{"2002:808:808::1", true},      // 6to4 of 8.8.8.8
		{"64:ff9b:1::1", false},        // local-use NAT64
		{"2001:0:4136:e378::1", false}, // Teredo
		{"2001:db8::1", false},
		{"fec0::1", false},
	} {
		if got := Public(netip.MustParseAddr(tc.ip)); got != tc.want {
			t.Errorf("Public(%s) = %v, want %v", tc.ip, got, tc.want)
		}
	}
}

func TestOpenInternet(t *testing.T) {
	// Every IPv4 address but 0.0.0.0/8 and 10.0.0.0/8 (reserved), the
	// first rule being 11.0.0.0/8.
	everyPublic := []string{"11.0.0.0/8", "1.0.0.0/8", "2.0.0.0/7", "4.0.0.0/6", "8.0.0.0/7", "12.0.0.0/6", "16.0.0.0/4",
		"32.0.0.0/3", "64.0.0.0/2", "128.0.0.0/1"}
	rules := func(ss ...string) []Rule {
		r, err := ParseRules(ss)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		what string
		n    Network
		want bool
	}{
		{"the internet", Network{Mode: NetInternet}, true},
		{"denyOut names only", Network{Mode: NetInternet, DenyOut: rules("*.tunnel.test", "denied.test")}, true},
		{"denyOut some addresses", Network{Mode: NetInternet, DenyOut: rules("203.0.113.0/24", "0.0.0.0/1")}, true},
		// E2B's allowlist recipe: allowInternetAccess, denyOut everything,
		// allowOut names (or addresses): no address is open that no rule names.
		{"denyOut 0.0.0.0/0", Network{Mode: NetInternet, DenyOut: rules("0.0.0.0/0"), AllowOut: rules("allowed.test", "198.51.100.0/24")}, false},
		{"denyOut the two halves", Network{Mode: NetInternet, DenyOut: rules("0.0.0.0/1", "128.0.0.0/1")}, false},
		// The reserved ranges are closed anyway: denyOut need not name
		// 0.0.0.0/8 or 10.0.0.0/8.
		{"denyOut every public range", Network{Mode: NetInternet, DenyOut: rules(everyPublic...)}, false},
		{"denyOut every public range but 11/8", Network{Mode: NetInternet, DenyOut: rules(everyPublic[1:]...)}, true},
		{"denyOut every public range but one address", Network{Mode: NetInternet, DenyOut: rules(append(everyPublic[1:],
			"11.0.0.0/9", "11.128.0.0/10", "11.192.0.0/11", "11.224.0.0/12", "11.240.0.0/13", "11.248.0.0/14", "11.252.0.0/15",
			"11.254.0.0/16", "11.255.0.0/17", "11.255.128.0/18", "11.255.192.0/19", "11.255.224.0/20", "11.255.240.0/21",
			"11.255.248.0/22", "11.255.252.0/23", "11.255.254.0/24", "11.255.255.0/25", "11.255.255.128/26",
			"11.255.255.192/27", "11.255.255.224/28", "11.255.255.240/29", "11.255.255.248/30", "11.255.255.252/31",
			"11.255.255.254")...)}, true},
		{"allowOut names", Network{Mode: NetFiltered, AllowOut: rules("allowed.test")}, false},
		// E2B's ALL_TRAFFIC in allowOut is every destination: allowOut
		// wins, whatever the mode and denyOut.
		{"allowOut 0.0.0.0/0 without the internet", Network{Mode: NetFiltered, AllowOut: rules("0.0.0.0/0")}, true},
		{"allowOut 0.0.0.0/0 over denyOut 0.0.0.0/0", Network{Mode: NetInternet, AllowOut: rules("0.0.0.0/0"), DenyOut: rules("0.0.0.0/0")}, true},
		{"allowOut half the internet", Network{Mode: NetFiltered, AllowOut: rules("0.0.0.0/1")}, false},
		{"no network", Network{}, false},
	} {
		if got := tc.n.OpenInternet(); got != tc.want {
			t.Errorf("%s: OpenInternet() = %v, want %v", tc.what, got, tc.want)
		}
	}
}

func TestNamesReserved(t *testing.T) {
	for _, tc := range []struct {
		rule string
		want bool
	}{
		{"10.1.0.0/16", true},     // inside 10.0.0.0/8
		{"10.0.0.0/8", true},      // the range itself
		{"169.254.169.254", true}, // a single address, whatever it is
		{"203.0.113.2", true},     // a single public address (a host's own, say)
		{"0.0.0.0/0", false},      // ALL_TRAFFIC: the internet
		{"0.0.0.0/1", false},
		{"8.0.0.0/7", false},      // public, and covers nothing reserved
		{"10.0.0.0/7", false},     // 10/8 and 11/8: wider than the range
		{"203.0.113.0/24", false}, // public: the host's address in it stays closed
		{"allowed.test", false},   // names never open reserved addresses
		{"*.allowed.test", false},
	} {
		r, err := ParseRule(tc.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.NamesReserved(); got != tc.want {
			t.Errorf("%s: NamesReserved() = %v, want %v", tc.rule, got, tc.want)
		}
	}
}
