package policy

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// NetMode is how much of the outside a sandbox can reach.
type NetMode string

const (
	// NetNone: loopback only, no other interface (the default).
	NetNone NetMode = ""
	// NetFiltered: an interface, through which only AllowOut is reachable.
	NetFiltered NetMode = "filtered"
	// NetInternet: every public address, less DenyOut (E2B's
	// allowInternetAccess).
	NetInternet NetMode = "internet"
)

// Network is a sandbox's egress policy. Whatever it says, the host, its
// loopback, link-local and metadata addresses, private and CGNAT ranges,
// multicast and other sandboxes are reachable only through an AllowOut
// address rule that names them: a name never opens them.
type Network struct {
	Mode NetMode
	// AllowOut wins over DenyOut, as in E2B.
	AllowOut []Rule
	DenyOut  []Rule
	// Rules transform the requests sent to the hosts they name (E2B's
	// network.rules): keys an exact name or "*." and a name, lower case
	// (ParseTransforms). They grant no egress: AllowOut or the mode must
	// let the host be reached.
	Rules map[string][]Transform `json:",omitempty"`
	// EgressProxy, if set, carries the sandbox's TCP egress: the daemon
	// dials its destinations through this SOCKS5 proxy of the user's
	// (E2B's network.egressProxy), after the policy allowed them.
	EgressProxy *EgressProxy `json:",omitempty"`
}

// EgressProxy is a SOCKS5 proxy, with its credentials if it needs them.
type EgressProxy struct {
	Address  string `json:"address"` // host:port
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Check reports the first problem with e.
func (e *EgressProxy) Check() error {
	host, port, err := net.SplitHostPort(e.Address)
	if err != nil || host == "" {
		return fmt.Errorf("egressProxy.address %q is not host:port", e.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("egressProxy.address %q: %q is not a port", e.Address, port)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Unmap().Is4() {
			return fmt.Errorf("egressProxy.address %q: sandboxes' egress is IPv4 only", e.Address)
		}
	} else if err := checkName(strings.ToLower(strings.TrimSuffix(host, "."))); err != nil {
		return fmt.Errorf("egressProxy.address %q: %v", e.Address, err)
	}
	switch {
	case e.Password != "" && e.Username == "":
		return errors.New("egressProxy: a password needs a username")
	case len(e.Username) > 255 || len(e.Password) > 255:
		return errors.New("egressProxy: SOCKS5 takes a username and a password of at most 255 bytes each")
	case !ValidHeaderValue(e.Username) || !ValidHeaderValue(e.Password):
		return errors.New("egressProxy: the username and password may not hold control characters")
	}
	return nil
}

// Rule is a destination: an address prefix, or a DNS name. A name that
// starts with "*." matches every name below it (at any depth), not
// itself.
type Rule struct {
	Prefix netip.Prefix // valid for an address rule
	Name   string       // lower case, without the final dot, for a name rule
}

// The most rules a policy holds: each connection is checked against all.
const maxRules = 256

// ParseRule parses a CIDR prefix, an IPv4 address or a DNS name
// ("example.com", "*.example.com").
func ParseRule(s string) (Rule, error) {
	if s == "" {
		return Rule{}, errors.New("an empty network rule")
	}
	if strings.ContainsAny(s, "/:") || isDigitsAndDots(s) {
		var p netip.Prefix
		var err error
		if strings.Contains(s, "/") {
			p, err = netip.ParsePrefix(s)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(s); err == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil {
			return Rule{}, fmt.Errorf("network rule %q is not a valid address or CIDR prefix", s)
		}
		if p.Addr().Zone() != "" || !p.Addr().Unmap().Is4() {
			return Rule{}, fmt.Errorf("network rule %q: sandboxes have IPv4 only, so an IPv6 rule could never match", s)
		}
		return Rule{Prefix: netip.PrefixFrom(p.Addr().Unmap(), min(p.Bits(), 32)).Masked()}, nil
	}
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	if err := checkName(strings.TrimPrefix(name, "*.")); err != nil {
		return Rule{}, fmt.Errorf("network rule %q: %v", s, err)
	}
	return Rule{Name: name}, nil
}

func isDigitsAndDots(s string) bool {
	return strings.Trim(s, "0123456789.") == ""
}

// checkName accepts host names as DNS carries them: labels of letters,
// digits, hyphens and underscores, 1 to 63 bytes each, 253 in all.
func checkName(name string) error {
	if len(name) == 0 || len(name) > 253 {
		return errors.New("a name must have 1 to 253 characters")
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return errors.New("each label of a name must have 1 to 63 characters")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%q is not a character of a host name (only a leading \"*.\" may be a wildcard)", c)
			}
		}
	}
	return nil
}

// String is the rule as ParseRule reads it.
func (r Rule) String() string {
	if r.Name != "" {
		return r.Name
	}
	if r.Prefix.IsSingleIP() {
		return r.Prefix.Addr().String()
	}
	return r.Prefix.String()
}

// MatchAddr reports whether a is in r's prefix; a name rule matches no address.
func (r Rule) MatchAddr(a netip.Addr) bool {
	return r.Name == "" && r.Prefix.IsValid() && r.Prefix.Contains(a.Unmap())
}

// AllTraffic is E2B's ALL_TRAFFIC, the rule for every destination.
var AllTraffic = netip.MustParsePrefix("0.0.0.0/0")

// IsReserved reports whether a is in a reserved range (private, CGNAT,
// loopback, link-local and metadata, multicast, …), or not IPv4.
func IsReserved(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() {
		return true
	}
	for _, p := range Reserved {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// NamesReserved reports whether address rule r may open the closed
// destinations it covers (reserved ranges, the host's addresses, other
// sandboxes): only a rule that names them does, a single address or a
// prefix wholly inside one reserved range. A wider one, such as
// AllTraffic or a prefix of public addresses that happens to hold the
// host's, is a rule about the internet: E2B's `allowOut: [ALL_TRAFFIC]`
// asks for the internet, never for the host or cloud metadata.
func (r Rule) NamesReserved() bool {
	if r.Name != "" || !r.Prefix.IsValid() {
		return false
	}
	if r.Prefix.IsSingleIP() {
		return true
	}
	for _, p := range Reserved {
		if p.Bits() <= r.Prefix.Bits() && p.Contains(r.Prefix.Addr()) {
			return true
		}
	}
	return false
}

// MatchName reports whether name (lower case, no final dot) is r's name
// or, for a "*." rule, below it.
func (r Rule) MatchName(name string) bool {
	switch {
	case r.Name == "":
		return false
	case strings.HasPrefix(r.Name, "*."):
		return strings.HasSuffix(name, r.Name[1:])
	default:
		return name == r.Name
	}
}

// ParseRules parses each of ss with ParseRule.
func ParseRules(ss []string) ([]Rule, error) {
	if len(ss) > maxRules {
		return nil, fmt.Errorf("%d network rules: at most %d are allowed", len(ss), maxRules)
	}
	rules := make([]Rule, 0, len(ss))
	for _, s := range ss {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// Strings returns the rules as ParseRule reads them.
func Strings(rules []Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.String()
	}
	return out
}

// Validate reports the first problem with n.
func (n *Network) Validate() error {
	switch n.Mode {
	case NetNone:
		if len(n.AllowOut)+len(n.DenyOut) > 0 {
			return errors.New("network rules need a network: this sandbox has loopback only")
		}
	case NetFiltered, NetInternet:
	default:
		return fmt.Errorf("unknown network mode %q", n.Mode)
	}
	if len(n.AllowOut) > maxRules || len(n.DenyOut) > maxRules {
		return fmt.Errorf("at most %d allow and %d deny rules are allowed", maxRules, maxRules)
	}
	for _, r := range append(n.AllowOut[:len(n.AllowOut):len(n.AllowOut)], n.DenyOut...) {
		if (r.Name == "") == !r.Prefix.IsValid() {
			return errors.New("a network rule is either a prefix or a name")
		}
	}
	if n.Mode == NetNone && len(n.Rules) > 0 {
		return errors.New("request rules need a network: this sandbox has loopback only")
	}
	if _, err := ParseTransforms(n.Rules); err != nil {
		return err
	}
	if n.EgressProxy != nil {
		if n.Mode == NetNone {
			return errors.New("egressProxy needs a network: this sandbox has loopback only")
		}
		if err := n.EgressProxy.Check(); err != nil {
			return err
		}
	}
	return nil
}

// OpenInternet reports whether n lets the sandbox reach internet
// addresses that no rule names: the internet mode, with denyOut's address
// rules leaving some public IPv4 address open, or AllTraffic in allowOut. Only then may a name that
// no allowOut rule names lead somewhere the sandbox can reach, so only
// then may such a name be looked up for it (E2B's allowlist recipe,
// allowInternetAccess with denyOut 0.0.0.0/0 and allowOut names, opens
// names, not the internet). An allowOut address rule opens its addresses
// and no name.
func (n *Network) OpenInternet() bool {
	// AllowOut's AllTraffic opens every public address whatever the mode
	// and DenyOut say (allowOut wins, as in E2B): the internet.
	for _, r := range n.AllowOut {
		if r.Name == "" && r.Prefix == AllTraffic {
			return true
		}
	}
	if n.Mode != NetInternet {
		return false
	}
	// The closed part of the IPv4 space as intervals: reserved ranges
	// and denyOut's prefixes. The internet is open if they leave a gap.
	type span struct{ lo, hi uint64 }
	closed := make([]span, 0, len(Reserved)+len(n.DenyOut))
	add := func(p netip.Prefix) {
		b := p.Masked().Addr().As4()
		lo := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
		closed = append(closed, span{lo, lo + 1<<(32-p.Bits()) - 1})
	}
	for _, p := range Reserved {
		add(p)
	}
	for _, r := range n.DenyOut {
		if r.Name == "" && r.Prefix.IsValid() {
			add(r.Prefix)
		}
	}
	slices.SortFunc(closed, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	var next uint64 // the lowest address not known to be closed
	for _, s := range closed {
		if s.lo > next {
			return true
		}
		next = max(next, s.hi+1)
	}
	return next <= 0xffffffff
}

// Reserved are the IPv4 destinations that are not the internet: this
// network, private and carrier-grade NAT ranges, loopback, link-local
// (cloud metadata), protocol assignments, benchmarking, multicast and
// reserved space. A sandbox reaches none unless an address rule names it;
// the daemon pulls a client's images from none.
var Reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network"
	netip.MustParsePrefix("10.0.0.0/8"),     // private
	netip.MustParsePrefix("100.64.0.0/10"),  // carrier-grade NAT
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, cloud metadata (169.254.169.254)
	netip.MustParsePrefix("172.16.0.0/12"),  // private
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("192.168.0.0/16"), // private
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking, used inside data centres
	netip.MustParsePrefix("224.0.0.0/4"),    // multicast
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, broadcast
}

// reserved6 are global-looking IPv6 prefixes that are not the internet,
// or that reach an IPv4 address a gateway unwraps (Teredo: its address is
// obfuscated; local-use NAT64: any IPv4 the operator maps).
var reserved6 = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("100::/64"),       // discard-only
	netip.MustParsePrefix("2001::/32"),      // Teredo
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
	netip.MustParsePrefix("fec0::/10"),      // site-local, deprecated but routed by some
}

// IPv6 prefixes that carry an IPv4 address for a gateway to unwrap.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// Public reports whether ip is an internet address: IPv4 outside
// Reserved; global unicast IPv6 outside unique-local space and reserved6,
// where an IPv6 address that carries an IPv4 one for a gateway to unwrap
// (NAT64 64:ff9b::/96, 6to4 2002::/16) is judged by that IPv4 address —
// else 64:ff9b::a9fe:a9fe would be the cloud metadata service.
func Public(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.Is4() {
		for _, p := range Reserved {
			if p.Contains(ip) {
				return false
			}
		}
		return true
	}
	b := ip.As16()
	switch {
	case nat64.Contains(ip):
		return Public(netip.AddrFrom4([4]byte(b[12:16])))
	case sixToFour.Contains(ip):
		return Public(netip.AddrFrom4([4]byte(b[2:6])))
	}
	for _, p := range reserved6 {
		if p.Contains(ip) {
			return false
		}
	}
	return ip.IsGlobalUnicast() && !ip.IsPrivate()
}
