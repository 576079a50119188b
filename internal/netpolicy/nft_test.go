package netpolicy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The host's nftables rules as text, in nft's words: a change to what a
// sandbox's packets meet shows here first. Root tests (flood_test.go,
// the SDK suites) check what the kernel does with them.

// TestTableRules: every rule of the host's table, in order.
func TestTableRules(t *testing.T) {
	want := `guard: iifname "al-*" iifname != @proxy drop
guard: iifname "al-*" jump iifname map @flood
prerouting: iifname "al-*" nfproto ipv4 ip daddr 169.254.0.53 l4proto udp th dport 53 redirect to iifname map @dns_udp
prerouting: iifname "al-*" nfproto ipv4 ip daddr 169.254.0.53 l4proto tcp th dport 53 redirect to iifname map @dns_tcp
prerouting: iifname "al-*" nfproto ipv4 l4proto tcp redirect to iifname map @proxy
input: iifname "al-*" ct status & dnat == 0 drop
input: iifname "al-*" l4proto tcp iifname . th dport != @tcp_in drop
input: iifname "al-*" l4proto udp iifname . th dport != @udp_in drop
input: iifname "al-*" l4proto != tcp l4proto != udp drop
forward: iifname "al-*" drop
forward: oifname "al-*" drop`
	var got []string
	for _, r := range tableRules() {
		switch r.chain {
		case "guard", "prerouting", "input", "forward":
		default:
			t.Errorf("a rule of chain %q, which ensureTable does not make", r.chain)
		}
		got = append(got, r.chain+": "+ruleText(t, r.exprs))
	}
	if g := strings.Join(got, "\n"); g != want {
		t.Errorf("the table's rules:\n%s\nwant:\n%s", g, want)
	}
}

// TestFloodRules: a sandbox's chain of limits, at its rates.
func TestFloodRules(t *testing.T) {
	for _, tc := range []struct {
		l    Limits
		want string
	}{
		{Limits{DNSRate: DefaultDNSRate, ConnectionRate: DefaultConnectionRate},
			"nfproto ipv4 ip daddr 169.254.0.53 l4proto udp th dport 53 limit over 100/second burst 200 drop\n" +
				"l4proto tcp ct state & new != 0 limit over 200/second burst 400 drop"},
		{Limits{DNSRate: Rate{N: 5, Per: time.Minute, Burst: 10}, ConnectionRate: Rate{N: 7, Per: time.Hour, Burst: 14}},
			"nfproto ipv4 ip daddr 169.254.0.53 l4proto udp th dport 53 limit over 5/minute burst 10 drop\n" +
				"l4proto tcp ct state & new != 0 limit over 7/hour burst 14 drop"},
	} {
		var got []string
		for _, exprs := range floodRules(tc.l) {
			got = append(got, ruleText(t, exprs))
		}
		if g := strings.Join(got, "\n"); g != tc.want {
			t.Errorf("limits %+v:\n%s\nwant:\n%s", tc.l, g, tc.want)
		}
	}
}

func TestElementKeys(t *testing.T) {
	if k := ifKey("al-00ff"); len(k) != unix.IFNAMSIZ || string(k[:7]) != "al-00ff" || k[7] != 0 {
		t.Errorf("ifKey = %q", k)
	}
	// The port follows the name, padded to a 32-bit register.
	if k := ifPortKey("al-0001", 0x1234); len(k) != unix.IFNAMSIZ+4 || string(k[unix.IFNAMSIZ:]) != "\x12\x34\x00\x00" {
		t.Errorf("ifPortKey = %q", k)
	}
	for name, want := range map[string]int{"al-0001": 1, "al-ffff": 0xffff, "al-": -1, "al-10000": -1, "eth0": -1, "al-xyz": -1} {
		slot, ok := slotOf(name)
		if ok != (want >= 0) || ok && slot != want {
			t.Errorf("slotOf(%q) = %d, %v; want %d", name, slot, ok, want)
		}
	}
}

// ruleText writes exprs as nft would list them, following what each
// register holds.
func ruleText(t *testing.T, exprs []expr.Any) string {
	t.Helper()
	held := &regs{what: map[uint32]string{}, at: map[uint32]int{}}
	var out []string
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			names := map[expr.MetaKey]string{expr.MetaKeyIIFNAME: "iifname", expr.MetaKeyOIFNAME: "oifname",
				expr.MetaKeyNFPROTO: "nfproto", expr.MetaKeyL4PROTO: "l4proto"}
			held.load(e.Register, names[e.Key])
		case *expr.Payload:
			switch {
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 16 && e.Len == 4:
				held.load(e.DestRegister, "ip daddr")
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
				held.load(e.DestRegister, "th dport")
			default:
				t.Fatalf("payload %+v", e)
			}
		case *expr.Ct:
			held.load(e.Register, map[expr.CtKey]string{expr.CtKeySTATUS: "ct status", expr.CtKeySTATE: "ct state"}[e.Key])
		case *expr.Bitwise:
			src := held.get(e.SourceRegister)
			mask := map[string]string{"ct status/32": "dnat", fmt.Sprintf("ct state/%d", expr.CtStateBitNEW): "new"}[fmt.Sprintf("%s/%d", src, binary.NativeEndian.Uint32(e.Mask))]
			held.load(e.DestRegister, src+" & "+mask)
		case *expr.Cmp:
			what := held.get(e.Register)
			op := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= "}[e.Op]
			if strings.Contains(what, " & ") {
				op = map[expr.CmpOp]string{expr.CmpOpEq: "== ", expr.CmpOpNeq: "!= "}[e.Op]
			}
			out = append(out, what+" "+op+cmpValue(t, what, e.Data))
		case *expr.Lookup:
			key := held.get(e.SourceRegister)
			if next := held.after(e.SourceRegister); next != "" {
				key += " . " + next // a concatenation
			}
			switch {
			case e.Invert:
				out = append(out, key+" != @"+e.SetName)
			case e.IsDestRegSet && e.DestRegister == 0:
				out = append(out, "jump "+key+" map @"+e.SetName)
			case e.IsDestRegSet:
				held.load(e.DestRegister, key+" map @"+e.SetName)
			default:
				out = append(out, key+" @"+e.SetName)
			}
		case *expr.Redir:
			out = append(out, "redirect to "+held.get(e.RegisterProtoMin))
		case *expr.Limit:
			unit := map[expr.LimitTime]string{expr.LimitTimeSecond: "second", expr.LimitTimeMinute: "minute", expr.LimitTimeHour: "hour"}[e.Unit]
			over := ""
			if e.Over {
				over = "over "
			}
			out = append(out, fmt.Sprintf("limit %s%d/%s burst %d", over, e.Rate, unit, e.Burst))
		case *expr.Verdict:
			out = append(out, map[expr.VerdictKind]string{expr.VerdictDrop: "drop", expr.VerdictAccept: "accept"}[e.Kind])
		default:
			t.Fatalf("an expression ruleText does not know: %T", e)
		}
	}
	return strings.Join(out, " ")
}

// regs is what each register holds, and in what order they were loaded.
// A 32-bit register (NFT_REG32_00 on) is a quarter of a 128-bit one, as
// the kernel lists them.
type regs struct {
	what map[uint32]string
	at   map[uint32]int
	n    int
}

func reg128(r uint32) uint32 {
	if r >= unix.NFT_REG32_00 {
		return (r-unix.NFT_REG32_00)/4 + 1
	}
	return r
}

func (r *regs) load(reg uint32, what string) {
	r.n++
	r.what[reg128(reg)], r.at[reg128(reg)] = what, r.n
}

func (r *regs) get(reg uint32) string { return r.what[reg128(reg)] }

// after is what the register after reg holds if it was loaded after
// reg: the second part of a concatenated key.
func (r *regs) after(reg uint32) string {
	if k := reg128(reg); r.at[k+1] > r.at[k] {
		return r.what[k+1]
	}
	return ""
}

// cmpValue writes data as a value of what.
func cmpValue(t *testing.T, what string, data []byte) string {
	t.Helper()
	switch {
	case what == "iifname" || what == "oifname":
		return fmt.Sprintf("%q", string(data)+"*") // a prefix: only its bytes are compared
	case what == "nfproto" && len(data) == 1:
		return map[byte]string{unix.NFPROTO_IPV4: "ipv4", unix.NFPROTO_IPV6: "ipv6"}[data[0]]
	case what == "l4proto" && len(data) == 1:
		return map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[data[0]]
	case what == "ip daddr" && len(data) == 4:
		return netip.AddrFrom4([4]byte(data)).String()
	case what == "th dport" && len(data) == 2:
		return fmt.Sprint(binary.BigEndian.Uint16(data))
	case strings.Contains(what, " & ") && len(data) == 4:
		return fmt.Sprint(binary.NativeEndian.Uint32(data))
	}
	t.Fatalf("a comparison of %s with %x", what, data)
	return ""
}

// TestKernelHoldsTheRules: the table the kernel holds, read back, says
// what TestTableRules reads.
func TestKernelHoldsTheRules(t *testing.T) {
	if !inLab(t) {
		return
	}
	if err := ensureTable(); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, r := range tableRules() {
		want = append(want, r.chain+": "+ruleText(t, r.exprs))
	}
	for _, chain := range []string{"guard", "prerouting", "input", "forward"} {
		rules, err := c.GetRules(table(), &nftables.Chain{Name: chain, Table: table()})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			got = append(got, chain+": "+ruleText(t, r.Exprs))
		}
	}
	if g, w := strings.Join(got, "\n"), strings.Join(want, "\n"); g != w {
		t.Errorf("the kernel holds:\n%s\nwant:\n%s", g, w)
	}
}

// TestTableLifetime: the host's table is there while a sandbox has a
// network, and a Host's Close deletes it only once none has: a server
// that stops leaves nothing in the host's nftables.
func TestTableLifetime(t *testing.T) {
	if !inLab(t) {
		return
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	there := func() bool {
		_, err := c.ListTableOfFamily(tableName, nftables.TableFamilyINet)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			t.Fatal(err)
		}
		return err == nil
	}
	// Slots are the host's, whatever the namespace: a sandbox of another
	// airlock keeps every namespace's table.
	f, err := lockTable()
	if err != nil {
		t.Fatal(err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 1, Len: 0}
	err = unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if lk.Type != unix.F_UNLCK {
		t.Skip("another airlock on this host has a sandbox with a network")
	}
	h, err := NewHost(Config{Upstream: []string{}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if there() {
		t.Fatal("a new namespace has the table before any sandbox")
	}
	closed := policy.Network{Mode: policy.NetFiltered}
	a, err := h.Attach(t.Context(), "a", closed)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Attach(t.Context(), "b", closed)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if !there() {
		t.Fatal("Close deleted the table while a sandbox had a network")
	}
	b.Close()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if there() {
		t.Fatal("the table outlived the last sandbox's network and Close")
	}
	// The next sandbox makes it again.
	c2, err := h.Attach(t.Context(), "c", closed)
	if err != nil {
		t.Fatal(err)
	}
	if !there() {
		t.Error("a sandbox's network without the table")
	}
	c2.Close()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPortsLeftAndDeleted: a slot's elements and chain of limits are
// found by one lookup (leftPorts), and deletePorts takes out exactly what
// addPorts put in, falling back to reading the maps when something else
// already took them out.
func TestPortsLeftAndDeleted(t *testing.T) {
	if !inLab(t) {
		return
	}
	if err := ensureTable(); err != nil {
		t.Fatal(err)
	}
	const a, b = linkPrefix + "fff1", linkPrefix + "fff2"
	left := func(name string) bool {
		t.Helper()
		l, err := leftPorts(name)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if left(a) {
		t.Fatalf("%s has ports before any were added", a)
	}
	p := ports{proxy: 4001, dnsUDP: 4002, dnsTCP: 4003}
	for _, name := range []string{a, b} {
		if err := addPorts(name, p, Limits{DNSRate: DefaultDNSRate, ConnectionRate: DefaultConnectionRate}); err != nil {
			t.Fatal(err)
		}
	}
	if !left(a) || !left(b) {
		t.Fatal("leftPorts does not see the ports added")
	}
	if err := deletePorts(a, p); err != nil {
		t.Fatal(err)
	}
	if left(a) || !left(b) {
		t.Errorf("after deleting %s's ports: left %v, %s's %v", a, left(a), b, left(b))
	}
	// Gone already (a Cleanup of another process): not an error.
	if err := removePorts(b); err != nil {
		t.Fatal(err)
	}
	if err := deletePorts(b, p); err != nil {
		t.Errorf("deleting ports that are gone: %v", err)
	}
	if mapped, err := mappedInterfaces(); err != nil || len(mapped) > 0 {
		t.Errorf("left in nftables: %v, %v", mapped, err)
	}
	if err := dropUnusedTable(); err != nil {
		t.Fatal(err)
	}
}
