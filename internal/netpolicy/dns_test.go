package netpolicy

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// upstream is a DNS server on loopback that answers every A question
// with one public address and writes down every name it is asked.
type upstream struct {
	addr  string
	mu    sync.Mutex
	asked []string
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{addr: pc.LocalAddr().String()}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		u.mu.Lock()
		u.asked = append(u.asked, strings.TrimSuffix(q.Question[0].Name, "."))
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(q)
		// A public name that aliases a cluster's service, as a cluster's
		// DNS answers it: the alias followed, the service's records.
		if qn := q.Question[0].Name; strings.HasPrefix(qn, "alias-into-cluster.") {
			svc := "db.default.svc.cluster.local."
			m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: qn, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 30}, Target: svc},
				&dns.SRV{Hdr: dns.RR_Header{Name: svc, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: 30}, Port: 5432, Target: "db-0." + svc})
			w.WriteMsg(m)
			return
		}
		if q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP("203.0.113.10")})
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return u
}

// saw reports the names asked so far that contain s.
func (u *upstream) saw(s string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, n := range u.asked {
		if strings.Contains(n, s) {
			out = append(out, n)
		}
	}
	return out
}

// TestDNSTunnellingEveryShape: under every shape of policy the API
// accepts, and after updateNetwork from one to another, a name the policy
// cannot let the sandbox reach never leaves the host, whatever the
// query's type; and the names it can reach do (the upstream's log works).
func TestDNSTunnellingEveryShape(t *testing.T) {
	up := newUpstream(t)
	a := &Attachment{}
	a.log.Store(slog.New(slog.DiscardHandler))
	a.filter.special = testHost().special
	r := newResolver(a, []string{up.addr}, DefaultDNSRate)
	// Refusals here must be the policy's, not the rate limit's.
	r.limit = rate.NewLimiter(rate.Inf, 0)
	shape := func(internet bool, allow, deny []string) policy.Network {
		n := policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, allow...), DenyOut: rules(t, deny...)}
		if internet {
			n.Mode = policy.NetInternet
		}
		return n
	}
	shapes := []struct {
		what string
		pol  policy.Network
		open bool // names below tunnel.test may be asked: the internet is open and they are not denied
	}{
		{"the internet", shape(true, nil, nil), true},
		{"allowOut names", shape(false, []string{"allowed.test", "*.cdn.test"}, nil), false},
		{"allowOut an address", shape(false, []string{"198.51.100.0/24"}, nil), false},
		// E2B's ALL_TRAFFIC in allowOut: every public address, so any name.
		{"allowOut 0.0.0.0/0 without the internet", shape(false, []string{"0.0.0.0/0"}, nil), true},
		{"E2B's recipe: the internet, denyOut 0.0.0.0/0, allowOut names", shape(true, []string{"allowed.test", "*.cdn.test"}, []string{"0.0.0.0/0"}), false},
		{"the internet, denyOut its two halves, allowOut an address", shape(true, []string{"198.51.100.7"}, []string{"0.0.0.0/1", "128.0.0.0/1"}), false},
		{"the internet, denyOut names only", shape(true, nil, []string{"*.tunnel.test", "denied.test"}), false},
		{"the internet, denyOut some addresses", shape(true, nil, []string{"203.0.113.0/24"}), true},
		{"closed", shape(false, nil, nil), false},
	}
	types := []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT, dns.TypeMX, dns.TypeSRV, dns.TypeCNAME, dns.TypeNS,
		dns.TypeSOA, dns.TypeCAA, dns.TypePTR, dns.TypeHTTPS, dns.TypeANY}
	ask := func(name string, qt uint16) *dns.Msg {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), qt)
		return r.answer(q)
	}
	// check asks, under the policy in force, names of every type below
	// tunnel.test (which no rule allows) and the reverse name of a public
	// address, and whether they reached the upstream; and names that are
	// never asked: reverse names of private addresses and zones.
	n := 0
	check := func(what string, open bool) {
		t.Helper()
		n++
		tag := fmt.Sprintf("t%d-", n)
		for i, qt := range types {
			ask(fmt.Sprintf("%s%d.tunnel.test", tag, i), qt)
		}
		if got := ask(tag+"x.tunnel.test", dns.TypeA); !open && (got.Rcode != dns.RcodeNameError || len(got.Answer) > 0) {
			t.Errorf("%s: an unreachable name answered %s, want NXDOMAIN", what, dns.RcodeToString[got.Rcode])
		}
		saw := up.saw(tag)
		switch {
		case open && len(saw) == 0:
			t.Errorf("%s: no name reached the upstream, though the internet is open (does the log work?)", what)
		case !open && len(saw) > 0:
			t.Errorf("%s: names the policy cannot reach left the host: %v", what, saw)
		}
		// A public address's reverse name: asked where the internet is open.
		rev := fmt.Sprintf("%d.100.51.198.in-addr.arpa", n%256)
		ask(rev, dns.TypePTR)
		if got, want := len(up.saw(rev)) > 0, a.policy().open; got != want {
			t.Errorf("%s: %s reached the upstream: %v, want %v", what, rev, got, want)
		}
		for _, q := range []struct {
			name string
			qt   uint16
		}{{"5.0.99.10.in-addr.arpa", dns.TypePTR}, {"5.0.99.10.in-addr.arpa", dns.TypeTXT}, {"10.in-addr.arpa", dns.TypeSOA},
			{"in-addr.arpa", dns.TypeNS}, {"1.7.100.51.198.in-addr.arpa", dns.TypePTR},
			{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa", dns.TypePTR}, {"allowed.test", dns.TypePTR}} {
			if m := ask(q.name, q.qt); m.Rcode != dns.RcodeNameError {
				t.Errorf("%s: %s %s answered %s, want NXDOMAIN", what, dns.TypeToString[q.qt], q.name, dns.RcodeToString[m.Rcode])
			}
		}
		if rev := up.saw(".0.99.10.in-addr.arpa"); len(rev) > 0 || len(up.saw("ip6.arpa")) > 0 || len(up.saw("1.7.100.51.198")) > 0 {
			t.Errorf("%s: reverse names of private addresses left the host: %v", what, rev)
		}
	}
	for _, s := range shapes {
		a.pol.Store(compile(s.pol))
		check(s.what, s.open)
		// allowOut's names are asked under every shape.
		if allowedByName(a.policy(), "allowed.test") {
			if m := ask("allowed.test", dns.TypeA); m.Rcode != dns.RcodeSuccess || len(up.saw("allowed.test")) == 0 {
				t.Errorf("%s: an allowed name was not forwarded: %v", s.what, m)
			}
			if m := ask("img.cdn.test", dns.TypeTXT); m.Rcode != dns.RcodeSuccess || len(up.saw("img.cdn.test")) == 0 {
				t.Errorf("%s: a name under an allowed wildcard was not forwarded: %v", s.what, m)
			}
		}
	}
	// updateNetwork: from each shape to each other, what is asked follows
	// the new policy at once.
	for _, from := range shapes {
		for _, to := range shapes {
			a.pol.Store(compile(from.pol))
			ask("before-update.tunnel.test", dns.TypeA)
			a.pol.Store(compile(to.pol))
			check(from.what+" → "+to.what, to.open)
		}
	}
}

// TestLocalZonesNeverAsked: names of the host's own network (a cluster's
// services, the host's search domains, the operator's zones, special-use
// names, single labels) never leave the host, under the internet and
// even where allowOut names them.
func TestLocalZonesNeverAsked(t *testing.T) {
	conf := t.TempDir() + "/resolv.conf"
	// A Kubernetes pod's resolv.conf.
	if err := os.WriteFile(conf, []byte("nameserver 10.96.0.10\nsearch airlock.svc.cluster.local svc.cluster.local cluster.local corp.example.\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	servers, search := resolvConf(conf)
	if !slices.Equal(servers, []string{"10.96.0.10:53"}) || !slices.Equal(search, []string{"airlock.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"}) {
		t.Fatalf("resolv.conf read as servers %v, search %v", servers, search)
	}
	own, err := zoneNames([]string{"K8s.Example."})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zoneNames([]string{"bad zone"}); err == nil {
		t.Error("a zone that is no name was accepted")
	}
	up := newUpstream(t)
	a := &Attachment{}
	a.log.Store(slog.New(slog.DiscardHandler))
	a.filter.special, a.filter.local = testHost().special, append(search, own...)
	r := newResolver(a, []string{up.addr}, DefaultDNSRate)
	r.limit = rate.NewLimiter(rate.Inf, 0)
	for _, pol := range []policy.Network{
		{Mode: policy.NetInternet},
		{Mode: policy.NetInternet, AllowOut: rules(t, "*.cluster.local", "kubernetes", "*.corp.example", "*.svc", "*.internal")},
	} {
		a.pol.Store(compile(pol))
		for _, name := range []string{
			"kubernetes", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
			"_https._tcp.kubernetes.default.svc.cluster.local", "db.airlock.svc.cluster.local", "cluster.local",
			"db.corp.example", "x.k8s.example", "metadata.google.internal", "printer.local", "router.home.arpa", "localhost",
		} {
			for _, qt := range []uint16{dns.TypeA, dns.TypeSRV, dns.TypeTXT} {
				q := new(dns.Msg)
				q.SetQuestion(dns.Fqdn(name), qt)
				if m := r.answer(q); m.Rcode != dns.RcodeNameError {
					t.Errorf("%s %s answered %s, want NXDOMAIN", dns.TypeToString[qt], name, dns.RcodeToString[m.Rcode])
				}
			}
		}
		// A public name goes out: the upstream's log works.
		q := new(dns.Msg)
		q.SetQuestion("kubernetes.example.", dns.TypeA)
		if m := r.answer(q); m.Rcode != dns.RcodeSuccess {
			t.Errorf("a public name: %v", m)
		}
	}
	// What the upstream finds inside the cluster behind a public alias
	// never reaches the sandbox.
	q := new(dns.Msg)
	q.SetQuestion("alias-into-cluster.example.", dns.TypeSRV)
	if m := r.answer(q); m.Rcode != dns.RcodeNameError || len(m.Answer) > 0 {
		t.Errorf("an alias into the cluster answered %v, want NXDOMAIN and nothing", m)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if !slices.Equal(up.asked, []string{"kubernetes.example", "kubernetes.example", "alias-into-cluster.example"}) {
		t.Errorf("the upstream was asked %v, want only the public name", up.asked)
	}
}

// A pool's network is made before the sandbox it becomes has an id: once
// named, its refusals are logged under the sandbox's id, not the pool's.
func TestNamedRefusals(t *testing.T) {
	var out strings.Builder
	h := testHost()
	h.log = slog.New(slog.NewTextHandler(&out, nil))
	a := &Attachment{host: h}
	a.Name("pool-base")
	a.filter.special = h.special
	a.pol.Store(compile(policy.Network{Mode: policy.NetFiltered}))
	r := newResolver(a, nil, DefaultDNSRate)
	r.limit = rate.NewLimiter(rate.Inf, 0)
	a.Name("sbx-claimed")
	q := new(dns.Msg)
	q.SetQuestion("denied.test.", dns.TypeA)
	if m := r.answer(q); m.Rcode != dns.RcodeNameError {
		t.Fatalf("a closed network resolved a name: %v", m)
	}
	if !strings.Contains(out.String(), "dns refused") || !strings.Contains(out.String(), "sandbox=sbx-claimed") || strings.Contains(out.String(), "pool-base") {
		t.Errorf("the refusal's log line does not name the sandbox it is for:\n%s", out.String())
	}
}
