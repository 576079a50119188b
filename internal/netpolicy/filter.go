package netpolicy

import (
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// reserved are the destinations no sandbox reaches unless an AllowOut
// address rule names them: a name that resolves into them (DNS rebinding)
// never opens them. The host's own addresses and the sandboxes' subnet
// are added per Host.
var reserved = policy.Reserved

// Ports whose traffic carries the name it is meant for, which is then
// checked: the HTTP Host header and the TLS server name.
const (
	httpPort  = 80
	httpsPort = 443
)

// DNS goes through the sandbox's own resolver only: a resolver elsewhere,
// plain (53) or over TLS (853), would answer names the policy refuses.
var dnsPorts = []uint16{53, 853}

// verdict is a decision with its reason, for the log.
type verdict struct {
	allow  bool
	reason string
}

// filter decides what one sandbox may reach, under its current policy and
// the names its resolver answered.
type filter struct {
	special func(netip.Addr) bool // reserved, the host's, other sandboxes'
	local   []string              // the host's own zones (Host.local)
	pins    pins
}

// compiled is a sandbox's policy as the proxy and the resolver decide by
// it. An Attachment holds one at a time and both read that one, so that
// they cannot disagree on what a name may reach.
type compiled struct {
	policy.Network
	open bool // Network.OpenInternet
}

func compile(pol policy.Network) *compiled {
	return &compiled{Network: pol, open: pol.OpenInternet()}
}

// checkAddr decides a connection to dst:port whose name, for HTTP and
// TLS ports, is name ("" when unknown). The order is the policy's:
// an address rule in AllowOut that names its destination wins over
// everything; reserved addresses and DNS servers are closed otherwise;
// then AllowOut's wider address rules; a name allowed by AllowOut is trusted only at the
// addresses the resolver gave this sandbox for it; then DenyOut; then the
// mode.
func (f *filter) check(pol *compiled, dst netip.Addr, port uint16, name string) verdict {
	// A rule that names its destination (an address, a prefix inside a
	// reserved range) wins over everything.
	for _, r := range pol.AllowOut {
		if r.NamesReserved() && r.MatchAddr(dst) {
			return verdict{true, "allowOut " + r.String()}
		}
	}
	if f.special(dst) {
		return verdict{false, "a host, private or reserved address"}
	}
	for _, p := range dnsPorts {
		if port == p {
			return verdict{false, "DNS goes through the sandbox's resolver"}
		}
	}
	// A wider one (E2B's ALL_TRAFFIC, a public prefix) opens the public
	// addresses it covers, DNS servers elsewhere not included: they would
	// answer names the policy refuses.
	for _, r := range pol.AllowOut {
		if r.MatchAddr(dst) {
			return verdict{true, "allowOut " + r.String()}
		}
	}
	if name != "" {
		for _, r := range pol.AllowOut {
			if r.MatchName(name) && f.pins.has(name, dst) {
				return verdict{true, "allowOut " + r.String()}
			}
		}
		for _, r := range pol.DenyOut {
			if r.MatchName(name) {
				return verdict{false, "denyOut " + r.String()}
			}
		}
	}
	for _, r := range pol.DenyOut {
		if r.MatchAddr(dst) {
			return verdict{false, "denyOut " + r.String()}
		}
	}
	if pol.Mode == policy.NetInternet {
		return verdict{true, "internet"}
	}
	if ok, _ := f.nameReachable(pol, name); name != "" && ok {
		return verdict{false, name + " did not resolve to this address through the sandbox's resolver"}
	}
	return verdict{false, "not in allowOut"}
}

// hasNameRules reports whether any rule of pol is a name.
func hasNameRules(pol *compiled) bool {
	for _, r := range append(pol.AllowOut[:len(pol.AllowOut):len(pol.AllowOut)], pol.DenyOut...) {
		if r.Name != "" {
			return true
		}
	}
	return false
}

// hasDenyNames reports whether any DenyOut rule of pol is a name.
func hasDenyNames(pol *compiled) bool {
	for _, r := range pol.DenyOut {
		if r.Name != "" {
			return true
		}
	}
	return false
}

// allowedByName reports whether a name rule of AllowOut matches name.
func allowedByName(pol *compiled, name string) bool {
	for _, r := range pol.AllowOut {
		if r.MatchName(name) {
			return true
		}
	}
	return false
}

// deniedByName reports whether a name rule of DenyOut matches name.
func deniedByName(pol *compiled, name string) bool {
	for _, r := range pol.DenyOut {
		if r.MatchName(name) {
			return true
		}
	}
	return false
}

// nameReachable reports whether name could lead the sandbox anywhere
// under pol, and if not, why. It is the one judgement of names: the
// resolver lets no other name leave the host (a lookup is a message to
// whoever answers for the name, so a name asked upstream is data out,
// DNS tunnelling, whether or not its answer is used), and the proxy
// trusts a name only at addresses the resolver pinned for it.
//
// The order: names of the host's own network (isLocal) and reverse names
// of addresses that are not public are never asked, whatever the rules;
// then
// allowOut's names, denyOut's names, and any other name only if the
// internet is open (pol.open): there an address of the name could be one
// the sandbox may reach, and DNS carries out nothing a connection could
// not. Under allowInternetAccess with denyOut 0.0.0.0/0, only allowOut's
// names are reachable, so only they are looked up.
func (f *filter) nameReachable(pol *compiled, name string) (bool, string) {
	switch {
	case f.isLocal(name):
		return false, "a name of the host's own network"
	case isReverse(name) && !f.publicReverse(name):
		return false, "a reverse lookup of a private or reserved address"
	case allowedByName(pol, name):
		return true, ""
	case deniedByName(pol, name):
		return false, "refused by the sandbox's network policy"
	case pol.open:
		return true, ""
	}
	return false, "not allowed by the sandbox's network policy"
}

// isReverse reports whether name is in the reverse-mapping zones.
func isReverse(name string) bool {
	return inZone(name, "in-addr.arpa") || inZone(name, "ip6.arpa")
}

// inZone reports whether name is zone or a name below it.
func inZone(name, zone string) bool {
	return name == zone || strings.HasSuffix(name, "."+zone)
}

// publicReverse reports whether a reverse name is that of one public IPv4
// address: the host's resolver may know names of private ones (a
// split-horizon view, a cluster's pods and services), and a zone above an
// address (10.in-addr.arpa) covers private ones too. Sandboxes have no
// IPv6, so ip6.arpa is never theirs to ask.
func (f *filter) publicReverse(name string) bool {
	rev, ok := strings.CutSuffix(name, ".in-addr.arpa")
	parts := strings.Split(rev, ".")
	if !ok || len(parts) != 4 {
		return false
	}
	ip, err := netip.ParseAddr(parts[3] + "." + parts[2] + "." + parts[1] + "." + parts[0])
	return err == nil && !f.special(ip)
}

// answerAllowed reports whether the resolver may hand out a as an address
// of a name: never a reserved one, unless an address rule allows it.
func (f *filter) answerAllowed(pol *compiled, a netip.Addr) bool {
	for _, r := range pol.AllowOut {
		if f.opensAddr(r, a) {
			return true
		}
	}
	return !f.special(a)
}

// opensAddr reports whether allowOut rule r opens address a: a closed
// address (reserved, the host's, another sandbox's) only if r names it
// (policy.Rule.NamesReserved), so that E2B's ALL_TRAFFIC, or any prefix
// wider than what it means to open, never opens the host or metadata.
func (f *filter) opensAddr(r policy.Rule, a netip.Addr) bool {
	return r.MatchAddr(a) && (r.NamesReserved() || !f.special(a))
}

// pins remembers which addresses the resolver gave the sandbox for which
// names, so that a connection presenting a name is allowed only to an
// address that name resolved to.
type pins struct {
	mu sync.Mutex
	m  map[string]map[netip.Addr]time.Time // name → address → expiry
}

// A pin outlives its DNS TTL: clients cache answers longer than they
// should, and the address was the name's when it was given.
const (
	minPin         = 10 * time.Minute
	maxPins        = 1024 // names per sandbox; expired ones make room
	maxPinsPerName = maxAnswerAddrs
)

func (p *pins) add(name string, a netip.Addr, ttl time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.m == nil {
		p.m = map[string]map[netip.Addr]time.Time{}
	}
	addrs := p.m[name]
	full := addrs == nil && len(p.m) >= maxPins || addrs != nil && len(addrs) >= maxPinsPerName
	if _, known := addrs[a]; full && !known {
		p.expire(now)
		addrs = p.m[name]
		if addrs == nil && len(p.m) >= maxPins || len(addrs) >= maxPinsPerName {
			return // full of live pins: the address stays unpinned, so closed
		}
	}
	if addrs == nil {
		addrs = map[netip.Addr]time.Time{}
		p.m[name] = addrs
	}
	addrs[a] = now.Add(max(ttl, minPin))
}

// expire drops what has expired; p.mu is held.
func (p *pins) expire(now time.Time) {
	for name, addrs := range p.m {
		for a, until := range addrs {
			if now.After(until) {
				delete(addrs, a)
			}
		}
		if len(addrs) == 0 {
			delete(p.m, name)
		}
	}
}

// hasAddr reports whether any name is pinned to a.
func (p *pins) hasAddr(a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, addrs := range p.m {
		if until, ok := addrs[a]; ok && now.Before(until) {
			return true
		}
	}
	return false
}

func (p *pins) has(name string, a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.m[name][a]
	return ok && time.Now().Before(until)
}
