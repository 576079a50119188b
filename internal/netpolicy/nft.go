package netpolicy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// One nftables table holds the rules of every sandbox on the host, of
// every airlock process, and never changes once made: it matches the
// host ends of sandboxes' veth pairs by name (linkPrefix) and looks up,
// per interface, the ports of that sandbox's proxy and resolver in three
// maps. A sandbox's network is its elements in the maps and sets and a
// chain of its own that holds its rate limits (a regular chain: it
// registers no netfilter hook, as a table or base chain per sandbox
// would, which costs milliseconds on these hosts), all added in one
// transaction.
//
//	prerouting (filter, before any NAT): from an interface with no
//	  element, everything is dropped; the rest jumps to the interface's
//	  chain in the flood map, where DNS packets to the resolver and new
//	  TCP connections beyond the sandbox's rates are dropped, before they
//	  cost the daemon anything.
//	prerouting (nat, ahead of other tables' NAT): from a sandbox, DNS to
//	  the resolver address goes to that sandbox's resolver, every TCP
//	  connection to its proxy: to the ports its interface maps to.
//	input: from a sandbox, only what was redirected, to that sandbox's
//	  own ports, is accepted.
//	forward: nothing from or to a sandbox is ever routed.
//
// So everything else a sandbox sends (UDP but DNS, ICMP, IPv6, TCP of a
// sandbox whose elements are gone) is dropped, whatever state a daemon
// left: the rules fail closed. The policy itself lives in the proxy and
// the resolver; changing it never touches the rules.
const (
	tableName = "airlock_v1"
	mapProxy  = "proxy"
	mapDNSUDP = "dns_udp"
	mapDNSTCP = "dns_tcp"
	// The (interface, port) pairs each sandbox's packets may reach on
	// the host once redirected.
	setTCPIn = "tcp_in"
	setUDPIn = "udp_in"
	// The verdict map from an interface to its chain of limits, each
	// named floodPrefix + the interface.
	mapFlood    = "flood"
	floodPrefix = "flood-"
)

// ports are a sandbox's entries in the table's maps.
type ports struct {
	proxy, dnsUDP, dnsTCP uint16
}

func portSet(name string) *nftables.Set {
	return &nftables.Set{Table: table(), Name: name, Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeInetService)}
}

// ifPortKey is an element of a portSet: the name, then the port padded to
// a 32-bit register, as the kernel concatenates them.
func ifPortKey(name string, port uint16) []byte {
	return append(ifKey(name), byte(port>>8), byte(port), 0, 0)
}

func table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName}
}

func portMap(name string) *nftables.Set {
	return &nftables.Set{Table: table(), Name: name, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeInetService,
		// How nft shows names: in the host's byte order, as the kernel compares them.
		KeyByteOrder: binaryutil.NativeEndian}
}

// lockTable takes the host-wide lock on the table (byte 0 of the slot
// lock file, which no slot uses), held until the file is closed: two
// airlock processes never make the table at once, and none deletes it
// while another makes sure of it.
func lockTable() (*os.File, error) {
	f, err := os.OpenFile(slotLockFile, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("network lock: %w", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 0, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &lk); err != nil {
		f.Close()
		return nil, fmt.Errorf("network lock: %w", err)
	}
	return f, nil
}

// dropUnusedTable deletes the table if no slot is held (no sandbox of any
// airlock process on the host has a network) and no sandbox interface is
// left (a killed daemon's sandbox that is frozen outlives its slot lock
// until the next start removes it): the table's rules are what keeps an
// al-* interface from the host. An Attach holds its slot before it makes
// sure of the table, so it either keeps the table here or finds it gone
// and makes it again; a slot held in another network namespace keeps
// this one's table too, which errs on the side of rules.
func dropUnusedTable() error {
	f, err := lockTable()
	if err != nil {
		return err
	}
	defer f.Close()
	// Every slot's byte: GETLK reports a lock of another open file
	// description, and slots are held through their processes' own
	// (slotLocks), never this one.
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 1, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return fmt.Errorf("network lock: %w", err)
	}
	if lk.Type != unix.F_UNLCK {
		return nil
	}
	if names, err := links(linkPrefix); err != nil || len(names) > 0 {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if _, err := c.ListTableOfFamily(tableName, nftables.TableFamilyINet); errors.Is(err, unix.ENOENT) {
		return nil
	} else if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	c.DelTable(table())
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: delete: %w", tableName, err)
	}
	return nil
}

// ensureTable makes the table if it is not there, under the table's lock.
func ensureTable() error {
	f, err := lockTable()
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if _, err := c.ListTableOfFamily(tableName, nftables.TableFamilyINet); err == nil {
		return addFloodRule(c)
	} else if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nftables: %w", err)
	}
	t := c.AddTable(table())
	maps := map[string]*nftables.Set{}
	for _, name := range []string{mapProxy, mapDNSUDP, mapDNSTCP} {
		maps[name] = portMap(name)
		if err := c.AddSet(maps[name], nil); err != nil {
			return fmt.Errorf("nftables map %s: %w", name, err)
		}
	}
	for _, name := range []string{setTCPIn, setUDPIn} {
		if err := c.AddSet(portSet(name), nil); err != nil {
			return fmt.Errorf("nftables set %s: %w", name, err)
		}
	}
	if err := c.AddSet(floodMap(), nil); err != nil {
		return fmt.Errorf("nftables map %s: %w", mapFlood, err)
	}
	accept := nftables.ChainPolicyAccept
	chains := map[string]*nftables.Chain{
		"guard": c.AddChain(&nftables.Chain{Name: "guard", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept}),
		// Ahead of the host's own NAT (Docker's, kube-proxy's at dstnat):
		// a sandbox's connections are this table's to redirect.
		"prerouting": c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 10), Policy: &accept}),
		"input": c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}),
		"forward": c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}),
	}
	for _, r := range tableRules() {
		c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain], Exprs: r.exprs})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: %w", tableName, err)
	}
	return nil
}

// rule is one rule of the host's table: its chain and its expressions.
type rule struct {
	chain string
	exprs []expr.Any
}

// tableRules are the rules of the host's table, in their order (the
// comment at the top of this file says what they do). A chain accepts
// what none of its rules matched: its drops and redirects are what it
// enforces.
func tableRules() []rule {
	fromSandbox := ifPrefix(unix.NFT_META_IIFNAME)
	resolver := resolverAddr.As4()
	r := func(chain string, e ...[]expr.Any) rule { return rule{chain, cat(e...)} }
	return []rule{
		r("guard", fromSandbox, notMapped(mapProxy), drop()),
		r("guard", fromSandbox, jumpByIf(mapFlood)),
		r("prerouting", fromSandbox, ipv4(), daddr(resolver), l4(unix.IPPROTO_UDP), dport(53), redirectByIf(mapDNSUDP)),
		r("prerouting", fromSandbox, ipv4(), daddr(resolver), l4(unix.IPPROTO_TCP), dport(53), redirectByIf(mapDNSTCP)),
		r("prerouting", fromSandbox, ipv4(), l4(unix.IPPROTO_TCP), redirectByIf(mapProxy)),
		r("input", fromSandbox, notDNATted(), drop()),
		r("input", fromSandbox, l4(unix.IPPROTO_TCP), notInPortSet(setTCPIn), drop()),
		r("input", fromSandbox, l4(unix.IPPROTO_UDP), notInPortSet(setUDPIn), drop()),
		r("input", fromSandbox, notL4(unix.IPPROTO_TCP), notL4(unix.IPPROTO_UDP), drop()),
		r("forward", fromSandbox, drop()),
		r("forward", ifPrefix(unix.NFT_META_OIFNAME), drop()),
	}
}

// floodRules are the rules of a sandbox's chain of limits: DNS packets
// to its resolver and new TCP connections beyond its rates are dropped.
func floodRules(l Limits) [][]expr.Any {
	resolver := resolverAddr.As4()
	return [][]expr.Any{
		cat(ipv4(), daddr(resolver), l4(unix.IPPROTO_UDP), dport(53), limitOver(l.DNSRate), drop()),
		cat(l4(unix.IPPROTO_TCP), ctNew(), limitOver(l.ConnectionRate), drop()),
	}
}

// addFloodRule gives a table made before the flood map (by an older
// airlock) the map and the rule that looks it up; the caller holds the
// host-wide lock. Sandboxes of older processes have no element in it,
// so they keep running without limits, as they did.
func addFloodRule(c *nftables.Conn) error {
	if _, err := c.GetSetByName(table(), mapFlood); err == nil {
		return nil
	} else if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nftables map %s: %w", mapFlood, err)
	}
	if err := c.AddSet(floodMap(), nil); err != nil {
		return fmt.Errorf("nftables map %s: %w", mapFlood, err)
	}
	c.AddRule(&nftables.Rule{Table: table(), Chain: &nftables.Chain{Name: "guard", Table: table()},
		Exprs: cat(ifPrefix(unix.NFT_META_IIFNAME), jumpByIf(mapFlood))})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: limits: %w", tableName, err)
	}
	return nil
}

func floodMap() *nftables.Set {
	return &nftables.Set{Table: table(), Name: mapFlood, IsMap: true, KeyType: nftables.TypeIFName,
		DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian}
}

// addPorts gives the sandbox behind hostIf its ports and its chain of
// limits, in one transaction: until then none of its traffic is
// redirected, so none is accepted, and once it is, it is limited.
func addPorts(hostIf string, p ports, l Limits) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	key := ifKey(hostIf)
	// The chain holds the limits' state (a token bucket per rule): one
	// per sandbox, so that a flood spends only its own sandbox's budget.
	ch := c.AddChain(&nftables.Chain{Name: floodPrefix + hostIf, Table: table()})
	for _, exprs := range floodRules(l) {
		c.AddRule(&nftables.Rule{Table: table(), Chain: ch, Exprs: exprs})
	}
	if err := c.SetAddElements(floodMap(), []nftables.SetElement{{Key: key,
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}); err != nil {
		return err
	}
	for _, e := range []struct {
		m    string
		port uint16
	}{{mapProxy, p.proxy}, {mapDNSUDP, p.dnsUDP}, {mapDNSTCP, p.dnsTCP}} {
		if err := c.SetAddElements(portMap(e.m), []nftables.SetElement{{Key: key, Val: binary.BigEndian.AppendUint16(nil, e.port)}}); err != nil {
			return err
		}
	}
	for _, e := range []struct {
		set  string
		port uint16
	}{{setTCPIn, p.proxy}, {setTCPIn, p.dnsTCP}, {setUDPIn, p.dnsUDP}} {
		if err := c.SetAddElements(portSet(e.set), []nftables.SetElement{{Key: ifPortKey(hostIf, e.port)}}); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: ports of %s: %w", hostIf, err)
	}
	return nil
}

// leftPorts reports whether an earlier holder of hostIf's slot may have
// left elements or a chain of limits: whether that chain exists. addPorts
// makes the chain with the elements in one transaction, and the removals
// take the elements out before the chain, so no element outlives it. One
// lookup by name, where reading the maps (removePorts) takes time in
// proportion to the sandboxes on the host, on every create. (What a table
// of an older airlock, without chains of limits, holds is swept by
// Cleanup.)
func leftPorts(hostIf string) (bool, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	defer conn.Close()
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: []byte(tableName + "\x00")},
		{Type: unix.NFTA_CHAIN_NAME, Data: []byte(floodPrefix + hostIf + "\x00")},
	})
	if err != nil {
		return false, err
	}
	_, err = conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETCHAIN),
			Flags: netlink.Request,
		},
		// struct nfgenmsg: the family, the version, no resource id.
		Data: append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("nftables chain %s: %w", floodPrefix+hostIf, err)
}

// deletePorts takes out exactly what addPorts gave hostIf, its elements
// (the sets before the maps, in one transaction, as in removePorts), then
// its chain of limits, without reading the maps: their size is the
// host's sandboxes, and a dump that a concurrent change cuts short
// (NLM_F_DUMP_INTR) can miss an element or show one twice, which made
// removals fail with ENOENT or EBUSY under load. Should the kernel refuse
// (something is not as addPorts left it), removePorts reads and removes
// whatever is there.
func deletePorts(hostIf string, p ports) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	key := ifKey(hostIf)
	del := func(set *nftables.Set, keys ...[]byte) {
		var elems []nftables.SetElement
		for _, k := range keys {
			elems = append(elems, nftables.SetElement{Key: k})
		}
		if err == nil {
			err = c.SetDeleteElements(set, elems)
		}
	}
	del(portSet(setTCPIn), ifPortKey(hostIf, p.proxy), ifPortKey(hostIf, p.dnsTCP))
	del(portSet(setUDPIn), ifPortKey(hostIf, p.dnsUDP))
	for _, m := range []string{mapProxy, mapDNSUDP, mapDNSTCP} {
		del(portMap(m), key)
	}
	del(floodMap(), key)
	if err == nil {
		err = c.Flush()
	}
	if err == nil {
		c.DelChain(&nftables.Chain{Name: floodPrefix + hostIf, Table: table()})
		err = c.Flush()
	}
	if err != nil {
		return removePorts(hostIf)
	}
	return nil
}

// removePorts takes hostIf's elements out of the maps and sets, and its
// chain of limits, where present. It reads first and changes only what
// it found: every transaction the kernel commits waits for an RCU grace
// period (~20 ms here), and Attach calls it for an interface that
// usually has nothing left, which six transactions made cost 100 ms.
// The sets go before the maps, in one transaction (an interface left in
// the maps but not in the sets has its packets redirected, then
// dropped); the chain last, once no element jumps to it (a chain still
// referenced cannot go).
func removePorts(hostIf string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	type found struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}
	var sets, maps []found
	for _, name := range []string{setTCPIn, setUDPIn, mapProxy, mapDNSUDP, mapDNSTCP, mapFlood} {
		set, err := c.GetSetByName(table(), name)
		if errors.Is(err, unix.ENOENT) {
			if name == setTCPIn {
				return nil // no table: nothing of anyone's
			}
			continue // the flood map of a table of an older airlock
		}
		if err != nil {
			return fmt.Errorf("nftables %s: %w", name, err)
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			return fmt.Errorf("nftables %s: %w", name, err)
		}
		var mine []nftables.SetElement
		for _, e := range elems {
			if len(e.Key) >= unix.IFNAMSIZ && strings.TrimRight(string(e.Key[:unix.IFNAMSIZ]), "\x00") == hostIf {
				mine = append(mine, nftables.SetElement{Key: e.Key})
			}
		}
		if len(mine) == 0 {
			continue
		}
		if set.IsMap {
			maps = append(maps, found{set, mine})
		} else {
			sets = append(sets, found{set, mine})
		}
	}
	for _, f := range append(sets, maps...) {
		if err := c.SetDeleteElements(f.set, f.elems); err != nil {
			return fmt.Errorf("nftables: remove %s from %s: %w", hostIf, f.set.Name, err)
		}
	}
	if len(sets)+len(maps) > 0 {
		if err := c.Flush(); err != nil {
			return fmt.Errorf("nftables: remove %s: %w", hostIf, err)
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == tableName && ch.Name == floodPrefix+hostIf {
			c.DelChain(ch)
			if err := c.Flush(); err != nil {
				return fmt.Errorf("nftables: remove the limits of %s: %w", hostIf, err)
			}
		}
	}
	return nil
}

// mappedInterfaces lists the interfaces that have elements in the maps
// or a chain of limits.
func mappedInterfaces() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	seen := map[string]bool{}
	var names []string
	for _, m := range []string{mapProxy, mapDNSUDP, mapDNSTCP, mapFlood} {
		set, err := c.GetSetByName(table(), m)
		if err != nil {
			if errors.Is(err, unix.ENOENT) && m == mapFlood {
				continue // a table of an older airlock: no limits
			}
			if errors.Is(err, unix.ENOENT) {
				return nil, nil // no table: nothing mapped
			}
			return nil, fmt.Errorf("nftables map %s: %w", m, err)
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			return nil, fmt.Errorf("nftables map %s: %w", m, err)
		}
		for _, e := range elems {
			if n := strings.TrimRight(string(e.Key), "\x00"); !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("nftables chains: %w", err)
	}
	for _, ch := range chains {
		if n, ok := strings.CutPrefix(ch.Name, floodPrefix); ok && ch.Table.Name == tableName && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return names, nil
}

// slotOf reads the slot from a sandbox interface's name.
func slotOf(name string) (int, bool) {
	hex, ok := strings.CutPrefix(name, linkPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 16)
	return int(n), err == nil
}

func ifKey(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ifPrefix matches an input or output interface whose name starts with
// linkPrefix (nft's "al-*": a comparison of the prefix's bytes only).
func ifPrefix(key expr.MetaKey) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(linkPrefix)},
	}
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// daddr matches the IPv4 destination; ipv4 must come first.
func daddr(a [4]byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
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

// notDNATted matches packets of connections that no prerouting rule
// redirected: a sandbox cannot address the daemon's listeners, or
// anything else of the host, itself.
func notDNATted() []expr.Any {
	const ipsDstNAT = 1 << 5 // IPS_DST_NAT
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
	}
}

// redirectByIf sends the packet to the port that map m gives its input
// interface, on that interface's address (the host's end of the veth);
// without an element the rule does not match and nothing is redirected.
func redirectByIf(m string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: m},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

// jumpByIf jumps to the chain that verdict map m gives the packet's
// input interface; without an element the rule does not match.
func jumpByIf(m string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m},
	}
}

// ctNew matches packets that open a connection (conntrack state new).
func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// limitOver matches packets beyond rate r, counted by this rule.
func limitOver(r Rate) []expr.Any {
	unit := map[time.Duration]expr.LimitTime{time.Second: expr.LimitTimeSecond, time.Minute: expr.LimitTimeMinute,
		time.Hour: expr.LimitTimeHour}[r.Per]
	return []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: r.N, Over: true, Unit: unit, Burst: r.Burst}}
}

// notMapped matches packets whose input interface has no element in m.
func notMapped(m string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: m, Invert: true},
	}
}

// notInPortSet matches TCP or UDP packets (l4 must come first) whose
// (input interface, destination port) is not in set.
func notInPortSet(set string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: unix.NFT_REG32_00},
		&expr.Payload{DestRegister: unix.NFT_REG32_00 + 4, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: unix.NFT_REG32_00, SetName: set, Invert: true},
	}
}

func notL4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{proto}},
	}
}

func drop() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}} }
