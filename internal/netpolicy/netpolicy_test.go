package netpolicy

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Rate // zero: refused
	}{
		{"100/s", Rate{N: 100, Per: time.Second, Burst: 200}},
		{"5/m", Rate{N: 5, Per: time.Minute, Burst: 10}},
		{"1/h", Rate{N: 1, Per: time.Hour, Burst: 2}},
		{"1073741824/s", Rate{N: 1 << 30, Per: time.Second, Burst: 1 << 31}},
		{"1073741825/s", Rate{}},
		{"0/s", Rate{}},
		{"-1/s", Rate{}},
		{"10/d", Rate{}},
		{"10", Rate{}},
		{"/s", Rate{}},
		{"ten/s", Rate{}},
		{"10/S", Rate{}},
		{"", Rate{}},
	} {
		got, err := ParseRate(tc.in)
		switch {
		case tc.want == (Rate{}) && err == nil:
			t.Errorf("ParseRate(%q) = %+v, want it refused", tc.in, got)
		case tc.want == (Rate{}) && !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.in)):
			t.Errorf("ParseRate(%q): %v does not name the rate", tc.in, err)
		case tc.want != (Rate{}) && (err != nil || got != tc.want):
			t.Errorf("ParseRate(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// TestNewHostRefuses: a configuration that cannot work is refused before
// anything of the host's is touched, with a reason.
func TestNewHostRefuses(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Subnet: netip.MustParsePrefix("10.0.0.0/25")}, "network subnet 10.0.0.0/25: an IPv4 prefix of /8 to /24 is needed"},
		{Config{Subnet: netip.MustParsePrefix("10.0.0.0/7")}, "network subnet 10.0.0.0/7: an IPv4 prefix"},
		{Config{Subnet: netip.MustParsePrefix("fd00::/64")}, "network subnet fd00::/64: an IPv4 prefix"},
		{Config{Limits: Limits{DNSRate: Rate{N: 1, Per: time.Millisecond}}}, "a network rate is per second, minute or hour, not per 1ms"},
		{Config{Limits: Limits{ConnectionRate: Rate{N: 1, Per: 24 * time.Hour}}}, "a network rate is per second, minute or hour, not per 24h0m0s"},
		{Config{LocalZones: []string{"corp.example", "not a zone"}}, `local zone "not a zone" is not a DNS name`},
	} {
		_, err := NewHost(tc.cfg, slog.New(slog.DiscardHandler))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("NewHost(%+v): %v, want %q…", tc.cfg, err, tc.want)
		}
	}
}

// TestSpecial: what no sandbox reaches unless an address rule opens it,
// at the edges of each range.
func TestSpecial(t *testing.T) {
	h := testHost()
	for addr, want := range map[string]bool{
		"203.0.113.2":      true, // the host's own
		"10.250.7.9":       true, // the sandboxes' subnet
		"169.254.0.53":     true, // the sandboxes' resolver address
		"0.255.255.255":    true,
		"1.0.0.0":          false,
		"9.255.255.255":    false,
		"10.0.0.0":         true,
		"10.255.255.255":   true,
		"11.0.0.0":         false,
		"100.63.255.255":   false,
		"100.64.0.0":       true,
		"100.127.255.255":  true,
		"100.128.0.0":      false,
		"126.255.255.255":  false,
		"127.0.0.1":        true,
		"128.0.0.0":        false,
		"169.253.255.255":  false,
		"169.254.169.254":  true,
		"169.255.0.0":      false,
		"172.15.255.255":   false,
		"172.16.0.0":       true,
		"172.31.255.255":   true,
		"172.32.0.0":       false,
		"192.0.0.170":      true,
		"192.0.1.0":        false,
		"192.167.255.255":  false,
		"192.168.0.1":      true,
		"192.169.0.0":      false,
		"198.17.255.255":   false,
		"198.18.0.0":       true,
		"198.19.255.255":   true,
		"198.20.0.0":       false,
		"223.255.255.255":  false,
		"224.0.0.0":        true,
		"239.255.255.255":  true,
		"240.0.0.0":        true,
		"255.255.255.255":  true,
		"203.0.113.3":      false,
		"::ffff:10.0.0.1":  true, // a mapped private address is that address
		"::ffff:8.8.4.4":   false,
		"::1":              true, // sandboxes have no IPv6
		"2606:4700::1111":  true,
		"::ffff:127.0.0.1": true,
	} {
		if got := h.special(netip.MustParseAddr(addr)); got != want {
			t.Errorf("special(%s) = %v, want %v", addr, got, want)
		}
	}
}

func TestSlotsAndLinks(t *testing.T) {
	for _, tc := range []struct {
		subnet string
		slots  int
	}{
		{"10.250.0.0/16", 1 << 14},
		{"10.0.0.0/8", 1 << 16}, // at most as many as interface names hold
		{"192.168.7.0/24", 64},
	} {
		h := &Host{subnet: netip.MustParsePrefix(tc.subnet)}
		if got := h.slots(); got != tc.slots {
			t.Errorf("slots of %s = %d, want %d", tc.subnet, got, tc.slots)
		}
	}
	for _, tc := range []struct {
		subnet               string
		slot                 int
		hostIf, host, sbAddr string
	}{
		{"10.250.0.0/16", 1, "al-0001", "10.250.0.5", "10.250.0.6"},
		{"10.250.0.0/16", 0x40, "al-0040", "10.250.1.1", "10.250.1.2"},
		{"10.250.0.0/16", 0x3fff, "al-3fff", "10.250.255.253", "10.250.255.254"},
		{"192.168.7.0/24", 63, "al-003f", "192.168.7.253", "192.168.7.254"},
	} {
		l := linkOf(netip.MustParsePrefix(tc.subnet), tc.slot)
		if l.hostIf != tc.hostIf || l.hostIP.String() != tc.host || l.sandboxIP.String() != tc.sbAddr || l.bits != 30 {
			t.Errorf("link of slot %d of %s: %+v", tc.slot, tc.subnet, l)
		}
		if slot, ok := slotOf(l.hostIf); !ok || slot != tc.slot {
			t.Errorf("slotOf(%s) = %d, want %d", l.hostIf, slot, tc.slot)
		}
		// The pair's /30 is inside the subnet, and the resolver's address
		// is on neither end.
		if !netip.MustParsePrefix(tc.subnet).Contains(l.sandboxIP) || l.sandboxIP == resolverAddr || l.hostIP == resolverAddr {
			t.Errorf("link of slot %d of %s is outside it: %+v", tc.slot, tc.subnet, l)
		}
	}
}

func TestResolvConf(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(conf, []byte(`# a comment
nameserver 10.0.0.2
nameserver fd00::53
nameserver not-an-address
nameserver
domain Site.Example.
search a.example bad_name? b.example x..y
options ndots:2
`), 0o644)
	servers, search := resolvConf(conf)
	if !slices.Equal(servers, []string{"10.0.0.2:53"}) {
		t.Errorf("servers: %v, want only the IPv4 one", servers)
	}
	if !slices.Equal(search, []string{"site.example", "a.example", "b.example"}) {
		t.Errorf("search domains: %v", search)
	}
	servers, search = resolvConf(filepath.Join(t.TempDir(), "missing"))
	if servers == nil || len(servers) != 0 || search != nil {
		t.Errorf("a missing file: %v %v, want no servers (not nil) and no search", servers, search)
	}
}

func TestIsLocal(t *testing.T) {
	f := &filter{local: []string{"corp.example"}}
	for name, want := range map[string]bool{
		"printer":                      true, // a single label
		"db.default.svc.cluster.local": true,
		"cluster.local":                true,
		"kubernetes.default.svc":       true,
		"host.local":                   true,
		"localhost":                    true,
		"x.localhost":                  true,
		"metadata.google.internal":     true,
		"router.home.arpa":             true,
		"wiki.corp.example":            true,
		"corp.example":                 true,
		"notcorp.example":              false,
		"example.com":                  false,
		"local.example.com":            false,
		"svc.example.com":              false,
		"internal.example.com":         false,
	} {
		if got := f.isLocal(name); got != want {
			t.Errorf("isLocal(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestNameReachable: the one judgement of names, with its reasons.
func TestNameReachable(t *testing.T) {
	f := &filter{special: testHost().special, local: []string{"corp.example"}}
	allow := rules(t, "api.example.com", "*.wild.example")
	for _, tc := range []struct {
		pol  *compiled
		name string
		why  string // "": reachable
	}{
		{compile(policy.Network{Mode: policy.NetFiltered, AllowOut: allow}), "api.example.com", ""},
		{compile(policy.Network{Mode: policy.NetFiltered, AllowOut: allow}), "x.wild.example", ""},
		{compile(policy.Network{Mode: policy.NetFiltered, AllowOut: allow}), "other.example.com", "not allowed by the sandbox's network policy"},
		{compile(policy.Network{Mode: policy.NetInternet}), "other.example.com", ""},
		{compile(policy.Network{Mode: policy.NetInternet, DenyOut: rules(t, "*.example.com")}), "x.example.com", "refused by the sandbox's network policy"},
		// allowOut wins over denyOut for a name.
		{compile(policy.Network{Mode: policy.NetInternet, DenyOut: rules(t, "*.example.com"), AllowOut: allow}), "api.example.com", ""},
		// E2B's allowlist recipe: only allowOut's names go out.
		{compile(policy.Network{Mode: policy.NetInternet, DenyOut: rules(t, "0.0.0.0/0"), AllowOut: allow}), "other.example.com", "not allowed by the sandbox's network policy"},
		// Never, whatever the rules.
		{compile(policy.Network{Mode: policy.NetInternet, AllowOut: rules(t, "*.corp.example")}), "wiki.corp.example", "a name of the host's own network"},
		{compile(policy.Network{Mode: policy.NetInternet}), "5.0.0.10.in-addr.arpa", "a reverse lookup of a private or reserved address"},
		{compile(policy.Network{Mode: policy.NetInternet}), "10.in-addr.arpa", "a reverse lookup of a private or reserved address"},
		{compile(policy.Network{Mode: policy.NetInternet}), "1.0.0.0.ip6.arpa", "a reverse lookup of a private or reserved address"},
		{compile(policy.Network{Mode: policy.NetInternet}), "4.4.8.8.in-addr.arpa", ""},
		{compile(policy.Network{Mode: policy.NetFiltered, AllowOut: allow}), "4.4.8.8.in-addr.arpa", "not allowed by the sandbox's network policy"},
	} {
		ok, why := f.nameReachable(tc.pol, tc.name)
		if ok != (tc.why == "") || why != tc.why {
			t.Errorf("nameReachable(%s) under %+v = %v %q, want %q", tc.name, tc.pol.Network, ok, why, tc.why)
		}
	}
}

func TestAnswerAllowed(t *testing.T) {
	f := &filter{special: testHost().special}
	pol := compile(policy.Network{Mode: policy.NetInternet, AllowOut: rules(t, "10.1.0.0/16")})
	for addr, want := range map[string]bool{"8.8.4.4": true, "10.1.2.3": true, "10.2.0.1": false, "127.0.0.1": false, "203.0.113.2": false} {
		if got := f.answerAllowed(pol, netip.MustParseAddr(addr)); got != want {
			t.Errorf("answerAllowed(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestPinsExpire: a pin ends at its time; expired ones make room for new
// names.
func TestPinsExpire(t *testing.T) {
	var p pins
	a := netip.MustParseAddr("203.0.113.10")
	p.add("x.test", a, time.Hour)
	if !p.hasAddr(a) || p.hasAddr(netip.MustParseAddr("203.0.113.11")) {
		t.Error("hasAddr")
	}
	// Older than they can be: a pin lasts at least minPin.
	p.mu.Lock()
	for name := range p.m {
		for addr := range p.m[name] {
			p.m[name][addr] = time.Now().Add(-time.Second)
		}
	}
	p.mu.Unlock()
	if p.has("x.test", a) || p.hasAddr(a) {
		t.Error("an expired pin still counts")
	}
	for i := range maxPins {
		p.add(fmt.Sprintf("n%d.test", i), a, 0)
	}
	if !p.has("n0.test", a) || len(p.m) != maxPins {
		t.Errorf("after filling: %d names", len(p.m))
	}
	if until := p.m["n0.test"][a]; time.Until(until) < minPin-time.Minute {
		t.Errorf("a pin with a TTL of 0 lasts until %s, want at least %s", until, minPin)
	}
}
