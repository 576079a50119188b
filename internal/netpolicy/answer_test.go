package netpolicy

import (
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// scripted is a DNS server on loopback, over UDP and TCP on one port,
// that answers each name with the records answer gives it, and writes
// down which transport each question came by.
type scripted struct {
	addr string
	mu   sync.Mutex
	by   []string // "udp name" or "tcp name"
}

func newScripted(t *testing.T, answer func(q dns.Question) (rrs []dns.RR, truncate bool)) *scripted {
	t.Helper()
	var pc net.PacketConn
	var ln net.Listener
	for range 10 { // a free UDP port whose TCP twin is free too
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp4", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
	}
	if ln == nil {
		t.Fatal("no port free for both UDP and TCP")
	}
	s := &scripted{addr: pc.LocalAddr().String()}
	handler := func(network string) dns.HandlerFunc {
		return func(w dns.ResponseWriter, q *dns.Msg) {
			s.mu.Lock()
			s.by = append(s.by, network+" "+strings.TrimSuffix(q.Question[0].Name, "."))
			s.mu.Unlock()
			m := new(dns.Msg)
			m.SetReply(q)
			rrs, truncate := answer(q.Question[0])
			if truncate && network == "udp" {
				m.Truncated = true
			} else {
				m.Answer = rrs
			}
			w.WriteMsg(m)
		}
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: handler("udp")}, {Listener: ln, Handler: handler("tcp")}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
		t.Cleanup(func() { srv.Shutdown() })
	}
	return s
}

func a(name, addr string) dns.RR {
	return &dns.A{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP(addr)}
}

func cname(name, target string) dns.RR {
	return &dns.CNAME{Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: dns.Fqdn(target)}
}

// resolverFor is a resolver of one sandbox under pol, asking upstream.
func resolverFor(t *testing.T, pol policy.Network, upstream ...string) (*resolver, *Attachment) {
	t.Helper()
	at := &Attachment{}
	at.log.Store(slog.New(slog.DiscardHandler))
	at.filter.special = testHost().special
	at.pol.Store(compile(pol))
	r := newResolver(at, upstream, DefaultDNSRate)
	r.limit = rate.NewLimiter(rate.Inf, 0)
	return r, at
}

func question(name string, qt uint16) *dns.Msg {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qt)
	q.SetEdns0(1232, false)
	return q
}

// ede is the extended error of m, "" if none.
func ede(m *dns.Msg) string {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				return e.ExtraText
			}
		}
	}
	return ""
}

// TestResolverAliases: an alias is followed as the upstream answered it,
// unless it leads into the host's network or to a name the policy
// refuses.
func TestResolverAliases(t *testing.T) {
	up := newScripted(t, func(q dns.Question) ([]dns.RR, bool) {
		switch strings.TrimSuffix(q.Name, ".") {
		case "www.example.com":
			return []dns.RR{cname("www.example.com", "cdn.example.net"), a("cdn.example.net", "203.0.113.40")}, false
		case "to-denied.example.com":
			return []dns.RR{cname("to-denied.example.com", "tracker.example.org"), a("tracker.example.org", "203.0.113.41")}, false
		case "to-allowed-denied.example.com":
			return []dns.RR{cname("to-allowed-denied.example.com", "ok.example.org"), a("ok.example.org", "203.0.113.42")}, false
		case "to-local.example.com":
			return []dns.RR{cname("to-local.example.com", "metadata.internal"), a("metadata.internal", "203.0.113.43")}, false
		}
		return nil, false
	})
	r, at := resolverFor(t, policy.Network{Mode: policy.NetInternet,
		DenyOut: rules(t, "*.example.org"), AllowOut: rules(t, "ok.example.org", "www.example.com")}, up.addr)
	for _, tc := range []struct {
		name  string
		rcode int
		why   string
		n     int
	}{
		{"www.example.com", dns.RcodeSuccess, "", 2},
		{"to-denied.example.com", dns.RcodeNameError, "an alias of a name the sandbox's network policy refuses", 0},
		{"to-allowed-denied.example.com", dns.RcodeSuccess, "", 2}, // allowOut names it: not refused
		{"to-local.example.com", dns.RcodeNameError, "an alias into the host's own network", 0},
	} {
		m := r.answer(question(tc.name, dns.TypeA))
		if m.Rcode != tc.rcode || ede(m) != tc.why || len(m.Answer) != tc.n {
			t.Errorf("%s: %s %q with %d records, want %s %q with %d", tc.name, dns.RcodeToString[m.Rcode], ede(m), len(m.Answer), dns.RcodeToString[tc.rcode], tc.why, tc.n)
		}
	}
	// The name asked is pinned to the address at the end of the alias,
	// for the proxy to check a connection's name by.
	if !at.filter.pins.has("www.example.com", netip.MustParseAddr("203.0.113.40")) {
		t.Error("an allowed name behind an alias was not pinned")
	}
}

// TestResolverUpstream: a truncated answer is asked again over TCP, and
// at most maxAnswerAddrs addresses of it are passed on; without an
// upstream, the sandbox is told the lookup failed.
func TestResolverUpstream(t *testing.T) {
	up := newScripted(t, func(q dns.Question) ([]dns.RR, bool) {
		var rrs []dns.RR
		for i := range 40 {
			rrs = append(rrs, a(q.Name, netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)}).String()))
		}
		return rrs, strings.HasPrefix(q.Name, "big.")
	})
	r, at := resolverFor(t, policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, "*.example.com")}, up.addr)
	m := r.answer(question("big.example.com", dns.TypeA))
	if m.Rcode != dns.RcodeSuccess || len(m.Answer) != maxAnswerAddrs {
		t.Errorf("a truncated answer: %s with %d records, want %d", dns.RcodeToString[m.Rcode], len(m.Answer), maxAnswerAddrs)
	}
	up.mu.Lock()
	by := strings.Join(up.by, ",")
	up.mu.Unlock()
	if by != "udp big.example.com,tcp big.example.com" {
		t.Errorf("the upstream was asked by %s", by)
	}
	at.filter.pins.mu.Lock()
	pinned := len(at.filter.pins.m["big.example.com"])
	at.filter.pins.mu.Unlock()
	if pinned != maxAnswerAddrs {
		t.Errorf("%d addresses pinned, want %d", pinned, maxAnswerAddrs)
	}

	// No upstream at all.
	r, _ = resolverFor(t, policy.Network{Mode: policy.NetInternet})
	if m := r.answer(question("x.example.com", dns.TypeA)); m.Rcode != dns.RcodeServerFailure || ede(m) != "no upstream server answered" {
		t.Errorf("without an upstream: %s %q", dns.RcodeToString[m.Rcode], ede(m))
	}
}

// TestResolverRefusesOddQueries: what is not one plain question about a
// host name in class IN is not passed on.
func TestResolverRefusesOddQueries(t *testing.T) {
	up := newScripted(t, func(q dns.Question) ([]dns.RR, bool) { return []dns.RR{a(q.Name, "203.0.113.50")}, false })
	r, _ := resolverFor(t, policy.Network{Mode: policy.NetInternet}, up.addr)
	two := question("a.example.com", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "b.example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	chaos := question("version.bind", dns.TypeTXT)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	update := question("example.com", dns.TypeSOA)
	update.Opcode = dns.OpcodeUpdate
	for _, tc := range []struct {
		what  string
		q     *dns.Msg
		rcode int
		why   string
	}{
		{"two questions", two, dns.RcodeNotImplemented, ""},
		{"class CHAOS", chaos, dns.RcodeNotImplemented, ""},
		{"an update", update, dns.RcodeNotImplemented, ""},
		{"a name with a space", question(`a\032b.example.com`, dns.TypeA), dns.RcodeRefused, "not a host name"},
		{"a PTR of a host name", question("www.example.com", dns.TypePTR), dns.RcodeNameError, "a reverse lookup of something other than an address"},
		{"an ANY", question("example.com", dns.TypeANY), dns.RcodeNotImplemented, "record type not served"},
		{"a single label", question("printer", dns.TypeA), dns.RcodeNameError, "a name of the host's own network"},
	} {
		m := r.answer(tc.q)
		if m.Rcode != tc.rcode || ede(m) != tc.why || len(m.Answer) != 0 {
			t.Errorf("%s: %s %q, want %s %q", tc.what, dns.RcodeToString[m.Rcode], ede(m), dns.RcodeToString[tc.rcode], tc.why)
		}
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.by) != 0 {
		t.Errorf("odd queries reached the upstream: %v", up.by)
	}
}

// TestResolverRate: past its rate a sandbox's queries are refused, with
// a reason, before anything is asked.
func TestResolverRate(t *testing.T) {
	up := newScripted(t, func(q dns.Question) ([]dns.RR, bool) { return []dns.RR{a(q.Name, "203.0.113.50")}, false })
	r, _ := resolverFor(t, policy.Network{Mode: policy.NetInternet}, up.addr)
	r.limit = rate.NewLimiter(0, 2) // two, never refilled
	var codes []string
	for range 3 {
		m := r.answer(question("x.example.com", dns.TypeA))
		codes = append(codes, dns.RcodeToString[m.Rcode]+" "+ede(m))
	}
	if got := strings.Join(codes, ","); got != "NOERROR ,NOERROR ,REFUSED too many queries" {
		t.Errorf("three queries at a burst of two: %s", got)
	}
}
