package netpolicy

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

func rules(t *testing.T, ss ...string) []policy.Rule {
	t.Helper()
	r, err := policy.ParseRules(ss)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// testHost is a Host whose own addresses are known, without asking the
// machine.
func testHost() *Host {
	return &Host{subnet: DefaultSubnet, addrs: []netip.Addr{netip.MustParseAddr("203.0.113.2")}, addrsAt: time.Now().Add(time.Hour)}
}

func TestFilterCheck(t *testing.T) {
	f := &filter{special: testHost().special}
	f.pins.add("allowed.test", netip.MustParseAddr("203.0.113.10"), time.Minute)
	f.pins.add("rebind.test", netip.MustParseAddr("10.99.0.5"), time.Minute)
	filtered := compile(policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, "allowed.test", "198.51.100.0/24", "10.1.0.0/16")})
	internet := compile(policy.Network{Mode: policy.NetInternet, DenyOut: rules(t, "203.0.113.20", "denied.test")})
	closed := compile(policy.Network{Mode: policy.NetFiltered})
	// E2B's ALL_TRAFFIC in allowOut, over a denyOut of it too: the
	// internet, never the host, private ranges or metadata.
	allTraffic := compile(policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, "0.0.0.0/0"), DenyOut: rules(t, "0.0.0.0/0")})
	// A public prefix that holds the host's address opens the others.
	hostNet := compile(policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, "203.0.113.0/24")})
	// E2B's allowlist recipe.
	recipe := compile(policy.Network{Mode: policy.NetInternet, DenyOut: rules(t, "0.0.0.0/0"), AllowOut: rules(t, "allowed.test")})
	for _, tc := range []struct {
		name string
		pol  *compiled
		dst  string
		port uint16
		sni  string
		want bool
	}{
		{"allowed name at its address", filtered, "203.0.113.10", 443, "allowed.test", true},
		{"allowed name over HTTP", filtered, "203.0.113.10", 80, "allowed.test", true},
		{"allowed name at another address", filtered, "203.0.113.30", 443, "allowed.test", false},
		{"another name at the allowed address", filtered, "203.0.113.10", 443, "other.test", false},
		{"no name at the allowed address", filtered, "203.0.113.10", 443, "", false},
		{"allowed name on another port", filtered, "203.0.113.10", 22, "", false},
		{"allowed CIDR", filtered, "198.51.100.7", 7000, "", true},
		{"allowed CIDR whatever the name", filtered, "198.51.100.7", 443, "evil.test", true},
		{"private, opened by an address rule", filtered, "10.1.2.3", 80, "", true},
		{"private, by name", filtered, "10.99.0.5", 80, "rebind.test", false},
		{"outside allowOut", filtered, "203.0.113.30", 80, "", false},
		{"internet", internet, "203.0.113.30", 8080, "", true},
		{"internet, a name that did not resolve here", internet, "203.0.113.30", 443, "allowed.test", true},
		{"internet, denied address", internet, "203.0.113.20", 80, "", false},
		{"internet, denied name", internet, "203.0.113.30", 443, "denied.test", false},
		{"internet, host address", internet, "203.0.113.2", 22, "", false},
		{"internet, sandbox subnet", internet, "10.250.0.2", 8000, "", false},
		{"internet, loopback", internet, "127.0.0.1", 80, "", false},
		{"internet, metadata", internet, "169.254.169.254", 80, "", false},
		{"internet, private", internet, "192.168.1.1", 80, "", false},
		{"internet, CGNAT", internet, "100.64.0.1", 80, "", false},
		{"internet, multicast", internet, "224.0.0.251", 5353, "", false},
		{"internet, broadcast", internet, "255.255.255.255", 80, "", false},
		{"internet, DNS elsewhere", internet, "203.0.113.53", 53, "", false},
		{"internet, DNS over TLS elsewhere", internet, "203.0.113.53", 853, "", false},
		{"closed", closed, "203.0.113.10", 443, "allowed.test", false},
		{"ALL_TRAFFIC, a public address", allTraffic, "203.0.113.30", 7000, "", true},
		{"ALL_TRAFFIC, a name", allTraffic, "203.0.113.30", 443, "other.test", true},
		{"ALL_TRAFFIC, host address", allTraffic, "203.0.113.2", 22, "", false},
		{"ALL_TRAFFIC, sandbox subnet", allTraffic, "10.250.0.2", 8000, "", false},
		{"ALL_TRAFFIC, loopback", allTraffic, "127.0.0.1", 80, "", false},
		{"ALL_TRAFFIC, metadata", allTraffic, "169.254.169.254", 80, "", false},
		{"ALL_TRAFFIC, private", allTraffic, "10.99.0.5", 80, "", false},
		{"ALL_TRAFFIC, DNS elsewhere", allTraffic, "203.0.113.53", 53, "", false},
		{"a public prefix, its host address", hostNet, "203.0.113.2", 22, "", false},
		{"a public prefix, another address", hostNet, "203.0.113.30", 7000, "", true},
		{"recipe, allowed name at its address", recipe, "203.0.113.10", 443, "allowed.test", true},
		{"recipe, another address", recipe, "203.0.113.30", 443, "other.test", false},
		{"recipe, an address without a name", recipe, "203.0.113.30", 7000, "", false},
	} {
		v := f.check(tc.pol, netip.MustParseAddr(tc.dst), tc.port, tc.sni)
		if v.allow != tc.want {
			t.Errorf("%s: %s:%d (%q) allowed %v (%s), want %v", tc.name, tc.dst, tc.port, tc.sni, v.allow, v.reason, tc.want)
		}
	}
}

func TestPins(t *testing.T) {
	var p pins
	a := netip.MustParseAddr("203.0.113.10")
	p.add("x.test", a, 0)
	if !p.has("x.test", a) || p.has("y.test", a) || p.has("x.test", netip.MustParseAddr("203.0.113.11")) {
		t.Error("pins remember the wrong things")
	}
	// Full of live pins: a new name is not pinned, so stays closed.
	for i := range maxPins {
		p.add(fmt.Sprintf("n%d.test", i), a, time.Hour)
	}
	p.add("late.test", a, time.Hour)
	if p.has("late.test", a) {
		t.Error("a pin past the limit was kept")
	}
	// One name holds at most maxPinsPerName addresses.
	var q pins
	for i := range maxPinsPerName + 5 {
		q.add("many.test", netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), time.Hour)
	}
	if n := len(q.m["many.test"]); n != maxPinsPerName {
		t.Errorf("%d addresses pinned for one name, want %d", n, maxPinsPerName)
	}
}

// sniffOver runs client on one end of a TCP connection on loopback and
// sniffs the other end.
func sniffOver(t *testing.T, port uint16, client func(net.Conn)) (string, []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		client(c)
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name, head, err := sniffName(c, port)
	if err != nil {
		t.Fatal(err)
	}
	return name, head
}

func TestSniffName(t *testing.T) {
	name, head := sniffOver(t, httpsPort, func(c net.Conn) {
		tls.Client(c, &tls.Config{ServerName: "Allowed.Test", InsecureSkipVerify: true}).Handshake()
	})
	if name != "allowed.test" || len(head) < 100 || head[0] != 0x16 {
		t.Errorf("TLS: name %q, %d bytes starting %x", name, len(head), head[:1])
	}
	name, head = sniffOver(t, httpPort, func(c net.Conn) {
		io.WriteString(c, "GET /x HTTP/1.1\r\nHost: allowed.test:8080\r\nUser-Agent: t\r\n\r\nbody")
		time.Sleep(100 * time.Millisecond)
	})
	if name != "allowed.test" || !strings.HasPrefix(string(head), "GET /x HTTP/1.1\r\n") {
		t.Errorf("HTTP: name %q, head %q", name, head)
	}
	// Neither HTTP nor TLS: no name, and every byte kept to send on.
	name, head = sniffOver(t, httpsPort, func(c net.Conn) { io.WriteString(c, "SSH-2.0-x\r\n"); c.(*net.TCPConn).CloseWrite() })
	if name != "" || string(head) != "SSH-2.0-x\r\n" {
		t.Errorf("not TLS: name %q, head %q", name, head)
	}
}

// TestResolverAnswer drives the resolver against a DNS server of the
// test's own on loopback.
func TestResolverAnswer(t *testing.T) {
	up, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	answers := map[string][]string{"allowed.test.": {"203.0.113.10"}, "rebind.test.": {"10.99.0.5"},
		"mixed.test.": {"10.99.0.5", "203.0.113.11"}, "denied.test.": {"203.0.113.20"}}
	srv := &dns.Server{PacketConn: up, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, a := range answers[q.Question[0].Name] {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(a)})
		}
		if len(m.Answer) == 0 {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	defer srv.Shutdown()

	a := &Attachment{}
	a.log.Store(slog.New(slog.DiscardHandler))
	a.filter.special = testHost().special
	a.pol.Store(compile(policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, "allowed.test", "rebind.test", "mixed.test")}))
	r := newResolver(a, []string{up.LocalAddr().String()}, DefaultDNSRate)
	ask := func(name string, qt uint16) *dns.Msg {
		q := new(dns.Msg)
		q.SetQuestion(name, qt)
		q.SetEdns0(1232, false)
		return r.answer(q)
	}
	if m := ask("allowed.test.", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Errorf("allowed: %v", m)
	}
	if !a.filter.pins.has("allowed.test", netip.MustParseAddr("203.0.113.10")) {
		t.Error("the answer was not pinned")
	}
	m := ask("denied.test.", dns.TypeA)
	if m.Rcode != dns.RcodeNameError || len(m.Answer) != 0 {
		t.Errorf("denied: %v", m)
	}
	if opt := m.IsEdns0(); opt == nil || len(opt.Option) == 0 || opt.Option[0].(*dns.EDNS0_EDE).InfoCode != dns.ExtendedErrorCodeBlocked {
		t.Errorf("denied without an extended error saying why: %v", m)
	}
	if m := ask("rebind.test.", dns.TypeA); m.Rcode != dns.RcodeRefused || len(m.Answer) != 0 {
		t.Errorf("rebinding: %v", m)
	}
	if a.filter.pins.has("rebind.test", netip.MustParseAddr("10.99.0.5")) {
		t.Error("a refused answer was pinned")
	}
	if m := ask("mixed.test.", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != "203.0.113.11" {
		t.Errorf("mixed answer, private part kept: %v", m)
	}
	if m := ask("allowed.test.", dns.TypeAAAA); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		t.Errorf("AAAA: %v", m)
	}
	if m := ask("allowed.test.", dns.TypeHTTPS); m.Rcode != dns.RcodeNotImplemented {
		t.Errorf("HTTPS record: %v", m)
	}
	if m := ask("ALLOWED.test.", dns.TypeA); m.Rcode != dns.RcodeSuccess {
		t.Errorf("names are not case-sensitive: %v", m)
	}
	// Names in escapes match rules as text but are other names on the wire.
	a.pol.Store(compile(policy.Network{Mode: policy.NetInternet, AllowOut: rules(t, "*.allowed.test")}))
	if m := ask(`x\.allowed.test.`, dns.TypeA); m.Rcode != dns.RcodeRefused {
		t.Errorf("an escaped name: %v", m)
	}
	if m := ask("5.0.99.10.in-addr.arpa.", dns.TypePTR); m.Rcode != dns.RcodeNameError {
		t.Errorf("a reverse lookup of a private address: %v", m)
	}
	if m := ask("1.2.3.4.5.in-addr.arpa.", dns.TypePTR); m.Rcode != dns.RcodeNameError {
		t.Errorf("a malformed reverse lookup: %v", m)
	}
	// The policy changes under the resolver at once.
	a.pol.Store(compile(policy.Network{Mode: policy.NetFiltered}))
	if m := ask("allowed.test.", dns.TypeA); m.Rcode != dns.RcodeNameError {
		t.Errorf("after the policy closed: %v", m)
	}
}
