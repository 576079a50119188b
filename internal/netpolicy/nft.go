package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// tablePrefix names the nftables tables of sandboxes: one table per
// sandbox, named after its slot, so that a sandbox's rules are made and
// removed in one transaction and a crashed daemon's are found by name.
const tablePrefix = "airlock-"

// ruleset is what one sandbox's table needs to know.
type ruleset struct {
	table    string
	hostIf   string
	resolver netip.Addr // the sandboxes' DNS address (DNAT to dnsUDP, dnsTCP)
	proxy    uint16     // ports of the daemon's listeners on the host's end
	dnsUDP   uint16
	dnsTCP   uint16
}

// install replaces the sandbox's table, atomically, with this one:
//
//	prerouting (nat): from hostIf, DNS to the resolver address goes to the
//	  resolver's ports; every other TCP connection goes to the proxy.
//	input: from hostIf, only what was redirected there is accepted.
//	forward: nothing from or to hostIf is ever routed.
//
// Everything else a sandbox sends (UDP but DNS, ICMP, IPv6) is dropped;
// the policy itself lives in the proxy and the resolver, so changing it
// never touches these rules.
func (r *ruleset) install() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: r.table}
	// Add, delete, add: one transaction that replaces a leftover table of
	// the same name or makes a new one.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	accept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	rule := func(ch *nftables.Chain, e ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e}) }
	iif := matchIf(unix.NFT_META_IIFNAME, r.hostIf)

	rule(pre, cat(iif, ipv4(), daddr(r.resolver), l4(unix.IPPROTO_UDP), dport(53), redirect(r.dnsUDP))...)
	rule(pre, cat(iif, ipv4(), daddr(r.resolver), l4(unix.IPPROTO_TCP), dport(53), redirect(r.dnsTCP))...)
	rule(pre, cat(iif, ipv4(), l4(unix.IPPROTO_TCP), redirect(r.proxy))...)

	rule(in, cat(iif, dnatted(), l4(unix.IPPROTO_TCP), dport(r.proxy), nftVerdict(expr.VerdictAccept))...)
	rule(in, cat(iif, dnatted(), l4(unix.IPPROTO_UDP), dport(r.dnsUDP), nftVerdict(expr.VerdictAccept))...)
	rule(in, cat(iif, dnatted(), l4(unix.IPPROTO_TCP), dport(r.dnsTCP), nftVerdict(expr.VerdictAccept))...)
	rule(in, cat(iif, nftVerdict(expr.VerdictDrop))...)

	rule(fwd, cat(iif, nftVerdict(expr.VerdictDrop))...)
	rule(fwd, cat(matchIf(unix.NFT_META_OIFNAME, r.hostIf), nftVerdict(expr.VerdictDrop))...)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: %w", r.table, err)
	}
	return nil
}

// removeTable deletes the named table if it exists.
func removeTable(name string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddTable(t) // so that the delete cannot fail for a missing table
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove nftables table %s: %w", name, err)
	}
	return nil
}

// tables lists the sandboxes' tables.
func tables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	var names []string
	for _, t := range ts {
		if strings.HasPrefix(t.Name, tablePrefix) {
			names = append(names, t.Name)
		}
	}
	return names, nil
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// matchIf matches the input or output interface's name.
func matchIf(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// daddr matches the IPv4 destination; ipv4 must come first.
func daddr(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
	}
}

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// dport matches a TCP or UDP destination port; l4 must come first.
func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

// dnatted matches packets of connections that a prerouting rule
// redirected: a sandbox cannot address the daemon's listeners itself.
func dnatted() []expr.Any {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// redirect sends the packet to port on the address of the interface it
// came in on: the host's end of the sandbox's veth.
func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

func nftVerdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}
