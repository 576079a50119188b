package netpolicy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/audit"
)

// resolver is one sandbox's DNS server: it answers only names the policy
// allows, from the daemon's upstream servers, drops answers that point
// into reserved ranges (DNS rebinding), and pins what it answered to the
// sandbox so that the proxy can check a connection's name against it.
type resolver struct {
	a        *Attachment
	upstream []string // host:port
	client   *dns.Client
	tcp      *dns.Client
	limit    *rate.Limiter
	servers  []*dns.Server
	wg       sync.WaitGroup
	queries  atomic.Int64 // received, answered or not: what reached the daemon
}

// dnsTimeout bounds one upstream exchange.
const dnsTimeout = 3 * time.Second

// The record types the resolver passes on; A answers are filtered and
// pinned, AAAA answers are empty (sandboxes have IPv4 only). Others, such
// as HTTPS records with address hints that nothing here would check, are
// refused as not implemented.
var forwardedTypes = map[uint16]bool{
	dns.TypeA: true, dns.TypeCNAME: true, dns.TypeMX: true, dns.TypeTXT: true, dns.TypeSRV: true,
	dns.TypeNS: true, dns.TypeSOA: true, dns.TypeCAA: true, dns.TypePTR: true,
}

// newResolver makes a's resolver. Its own limit is the nftables rules'
// (Limits.DNSRate), which count UDP packets: here it also bounds queries
// over TCP, many of which one connection can carry.
func newResolver(a *Attachment, upstream []string, limit Rate) *resolver {
	return &resolver{
		a:        a,
		upstream: upstream,
		client:   &dns.Client{Net: "udp", Timeout: dnsTimeout},
		tcp:      &dns.Client{Net: "tcp", Timeout: dnsTimeout},
		limit:    rate.NewLimiter(rate.Limit(float64(limit.N)/limit.Per.Seconds()), int(limit.N)+int(limit.Burst)),
	}
}

// A sandbox may hold this many DNS connections over TCP at once, each
// idle for at most dnsIdle: each is a goroutine and a socket of the
// daemon's.
const (
	dnsTCPConns = 16
	dnsIdle     = 2 * time.Second
)

// serve answers queries on pc (UDP) and ln (TCP) until close.
func (r *resolver) serve(pc net.PacketConn, ln net.Listener) {
	idle := func() time.Duration { return dnsIdle }
	tcp := &dns.Server{Listener: netutil.LimitListener(ln, dnsTCPConns), Handler: r, IdleTimeout: idle, ReadTimeout: dnsIdle, WriteTimeout: dnsIdle}
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: r}, tcp} {
		r.servers = append(r.servers, s)
		r.wg.Add(1)
		go func() { defer r.wg.Done(); _ = s.ActivateAndServe() }()
	}
}

func (r *resolver) close() {
	for _, s := range r.servers {
		_ = s.Shutdown()
	}
	r.wg.Wait()
}

// ServeDNS answers one query.
func (r *resolver) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	r.queries.Add(1)
	resp := r.answer(q)
	why := extendedError(resp)
	if q.IsEdns0() == nil {
		resp.Extra = slices.DeleteFunc(resp.Extra, func(rr dns.RR) bool { return rr.Header().Rrtype == dns.TypeOPT })
	}
	_ = w.WriteMsg(resp)
	r.audit(q, resp, why)
}

// extendedError is the text of m's extended DNS error, if it has one.
func extendedError(m *dns.Msg) string {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if ede, ok := o.(*dns.EDNS0_EDE); ok {
				return ede.ExtraText
			}
		}
	}
	return ""
}

// audit writes the lookup down in the sandbox's trail: the name, what
// it was answered (the addresses) or why not.
func (r *resolver) audit(q *dns.Msg, resp *dns.Msg, why string) {
	if !r.a.auditing() || len(q.Question) != 1 {
		return
	}
	e := audit.Event{Kind: "dns", Proto: "dns " + dns.TypeToString[q.Question[0].Qtype],
		Name: strings.ToLower(strings.TrimSuffix(q.Question[0].Name, ".")), Decision: "allowed"}
	if resp.Rcode != dns.RcodeSuccess {
		e.Decision, e.Rule = "denied", dns.RcodeToString[resp.Rcode]
		if why != "" {
			e.Rule += ": " + why
		}
	}
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			e.Answers = append(e.Answers, a.A.String())
		}
	}
	r.a.record(e)
}

func (r *resolver) answer(q *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(q)
	resp.RecursionAvailable = true
	// The reason goes in an extended error, which ServeDNS keeps for the
	// audit trail and sends only to a client that speaks EDNS.
	fail := func(rcode int, ede uint16, why string) *dns.Msg {
		resp.Rcode = rcode
		if ede != 0 {
			resp.SetEdns0(1232, false)
			resp.IsEdns0().Option = append(resp.IsEdns0().Option, &dns.EDNS0_EDE{InfoCode: ede, ExtraText: why})
		}
		return resp
	}
	if q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 || q.Question[0].Qclass != dns.ClassINET {
		return fail(dns.RcodeNotImplemented, 0, "")
	}
	if !r.limit.Allow() {
		return fail(dns.RcodeRefused, dns.ExtendedErrorCodeNotReady, "too many queries")
	}
	qt := q.Question[0].Qtype
	name := strings.ToLower(strings.TrimSuffix(q.Question[0].Name, "."))
	if !hostName(name) {
		// Escapes and odd bytes: "x\.evil.test" would match a rule for
		// "*.evil.test" as text, and be a child of "test." on the wire.
		return fail(dns.RcodeRefused, dns.ExtendedErrorCodeBlocked, "not a host name")
	}
	pol := r.a.policy()
	if qt == dns.TypePTR && !isReverse(name) {
		return fail(dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, "a reverse lookup of something other than an address")
	}
	// Before anything is sent: the name itself is what would go out.
	if ok, why := r.a.filter.nameReachable(pol, name); !ok {
		r.a.logger().Info("dns refused", "name", name, "why", why)
		return fail(dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, why)
	}
	if qt == dns.TypeAAAA {
		return resp // no IPv6 in a sandbox: no addresses, and no error
	}
	if !forwardedTypes[qt] {
		return fail(dns.RcodeNotImplemented, dns.ExtendedErrorCodeNotSupported, "record type not served")
	}
	up, err := r.exchange(name, qt)
	if err != nil {
		r.a.logger().Warn("dns upstream", "name", name, "err", err)
		return fail(dns.RcodeServerFailure, dns.ExtendedErrorCodeNetworkError, "no upstream server answered")
	}
	resp.Rcode = up.Rcode
	resp.Compress = true
	// Pins matter only for names that allowOut opens: others are never
	// checked against them, and need not cost the daemon memory.
	pin := allowedByName(pol, name)
	filtered, addrs := false, 0
	for _, rr := range up.Answer {
		// A resolver inside the host's network follows an alias into it
		// (a cluster's DNS chases a CNAME into cluster.local and answers
		// the service's records): nothing found there goes to the sandbox.
		if owner := strings.ToLower(strings.TrimSuffix(rr.Header().Name, ".")); r.a.filter.isLocal(owner) {
			r.a.logger().Info("dns refused", "name", name, "alias", owner)
			resp.Answer = nil
			return fail(dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, "an alias into the host's own network")
		}
		switch rr := rr.(type) {
		case *dns.A:
			ip, ok := netip.AddrFromSlice(rr.A.To4())
			if !ok || !r.a.filter.answerAllowed(pol, ip) {
				filtered = true
				continue
			}
			if addrs++; addrs > maxAnswerAddrs {
				continue
			}
			if pin {
				r.a.filter.pins.add(name, ip, time.Duration(rr.Hdr.Ttl)*time.Second)
			}
		case *dns.AAAA:
			continue
		case *dns.CNAME:
			// A name that denyOut refuses is refused behind an alias too.
			target := strings.ToLower(strings.TrimSuffix(rr.Target, "."))
			if r.a.filter.isLocal(target) {
				r.a.logger().Info("dns refused", "name", name, "alias", target)
				resp.Answer = nil
				return fail(dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, "an alias into the host's own network")
			}
			if !allowedByName(pol, target) && deniedByName(pol, target) {
				r.a.logger().Info("dns refused", "name", name, "alias", target)
				resp.Answer = nil
				return fail(dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, "an alias of a name the sandbox's network policy refuses")
			}
		}
		resp.Answer = append(resp.Answer, rr)
	}
	if filtered && qt == dns.TypeA && !hasA(resp.Answer) {
		r.a.logger().Info("dns answer refused", "name", name, "why", "private or reserved addresses")
		resp.Answer = nil
		return fail(dns.RcodeRefused, dns.ExtendedErrorCodeFiltered, "the name points to private or reserved addresses")
	}
	return resp
}

// maxAnswerAddrs is the most addresses of one answer passed on (and
// pinned): more helps no client, and would cost memory.
const maxAnswerAddrs = 32

// hostName reports whether name is made of host-name labels only.
func hostName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func hasA(rrs []dns.RR) bool {
	for _, rr := range rrs {
		if _, ok := rr.(*dns.A); ok {
			return true
		}
	}
	return false
}

// exchange asks the upstream servers in turn, over TCP when UDP's answer
// was truncated.
func (r *resolver) exchange(name string, qt uint16) (*dns.Msg, error) {
	if len(r.upstream) == 0 {
		return nil, errors.New("no upstream DNS server is configured")
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qt)
	m.SetEdns0(1232, false)
	var err error
	for _, up := range r.upstream {
		ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
		var resp *dns.Msg
		resp, _, err = r.client.ExchangeContext(ctx, m, up)
		if err == nil && resp.Truncated {
			resp, _, err = r.tcp.ExchangeContext(ctx, m, up)
		}
		cancel()
		if err == nil {
			return resp, nil
		}
	}
	return nil, err
}
