// Package netpolicy gives sandboxes a network they may use only as their
// policy says: a network namespace per sandbox with one veth pair to the
// daemon, an nftables table that sends every TCP connection to the
// daemon's proxy and DNS to the daemon's resolver and drops everything
// else, and the proxy and resolver that apply the policy.
//
// Nothing a sandbox sends is routed. The proxy dials allowed destinations
// from the host, after checking the address, and for HTTP and TLS the name
// the client asked for against the addresses the resolver gave this
// sandbox for it. The resolver answers only allowed names and never with
// a private or reserved address.
package netpolicy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/rangelock"
)

// resolverAddr is the address every sandbox's /etc/resolv.conf names
// (layout.Resolver). It is on no interface: the sandbox's nftables table
// redirects DNS sent there to that sandbox's resolver, so that every
// sandbox has the same resolv.conf.
var resolverAddr = netip.MustParseAddr(layout.Resolver)

// DefaultSubnet is where the two ends of sandboxes' veth pairs get their
// addresses, a /30 each.
var DefaultSubnet = netip.MustParsePrefix("10.250.0.0/16")

// ErrUnavailable: this host cannot make sandbox networks (no nftables in
// its kernel, say).
var ErrUnavailable = errors.New("sandbox networks are not available on this host")

// Limits bound one sandbox's use of the network.
type Limits struct {
	Connections int   // open at once; 0: DefaultConnections
	Bandwidth   int64 // bytes per second in each direction; 0: no limit
	// DNS packets to its resolver and new TCP connections (to its proxy,
	// whatever their destination) a sandbox may send. The host's
	// nftables rules count them, per sandbox, and drop the excess before
	// it reaches the daemon: the resolver and the proxy run in the
	// daemon, whose CPU no sandbox's cgroup is charged for. Zero:
	// DefaultDNSRate, DefaultConnectionRate.
	DNSRate, ConnectionRate Rate
}

// DefaultConnections is how many connections a sandbox may have open at once.
const DefaultConnections = 256

// Rate is N packets per Per, in bursts of up to Burst at once.
type Rate struct {
	N     uint64
	Per   time.Duration // a second, a minute or an hour
	Burst uint32
}

// The default rates: far above what package installers need (pip and
// npm keep connections alive and look up a few names a second), far
// below what would cost the daemon a core.
var (
	DefaultDNSRate        = Rate{N: 100, Per: time.Second, Burst: 200}
	DefaultConnectionRate = Rate{N: 200, Per: time.Second, Burst: 400}
)

// ParseRate reads a rate as "N/s", "N/m" or "N/h" (per second, minute or
// hour), with bursts of twice N.
func ParseRate(s string) (Rate, error) {
	n, unit, ok := strings.Cut(s, "/")
	per := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	v, err := strconv.ParseUint(n, 10, 32)
	if !ok || per == 0 || err != nil || v == 0 || v > 1<<30 {
		return Rate{}, fmt.Errorf("rate %q: want N/s, N/m or N/h with N from 1 to %d", s, 1<<30)
	}
	return Rate{N: v, Per: per, Burst: uint32(2 * v)}, nil
}

// Config is a Host's configuration.
type Config struct {
	Subnet   netip.Prefix // zero: DefaultSubnet
	Upstream []string     // DNS servers, host:port; nil: the host's /etc/resolv.conf
	// LocalZones are DNS zones of the host's network beyond the ones
	// always refused (localZones, the host's search domains): a
	// sandbox's lookups under them never leave the host.
	LocalZones []string
	Limits     Limits
	// Budget is how many bytes a sandbox's connections may carry, both
	// ways together, in its life: past it its egress ends (and its audit
	// trail says so). Zero: no budget.
	Budget int64
	// Roots verify the servers of intercepted HTTPS; nil: the host's
	// (SSL_CERT_FILE and SSL_CERT_DIR name others).
	Roots *x509.CertPool
}

// Host makes sandbox networks in the daemon's network namespace.
type Host struct {
	subnet   netip.Prefix
	upstream []string
	local    []string // zones no lookup of a sandbox leaves the host for, beyond localZones
	limits   Limits
	ca       *CA
	roots    *x509.CertPool
	budget   int64
	audit    func(sandbox string, e audit.Event)
	secrets  func(name string) (string, error)
	log      *slog.Logger

	addrsMu sync.Mutex
	addrs   []netip.Addr // the host's own, refreshed every addrsTTL
	addrsAt time.Time
}

const addrsTTL = 2 * time.Second

// NewHost checks cfg and the host and returns a Host. It needs root.
func NewHost(cfg Config, log *slog.Logger) (*Host, error) {
	h := &Host{subnet: cfg.Subnet, upstream: cfg.Upstream, limits: cfg.Limits, roots: cfg.Roots, budget: cfg.Budget, log: log}
	if !h.subnet.IsValid() {
		h.subnet = DefaultSubnet
	}
	if !h.subnet.Addr().Is4() || h.subnet.Bits() > 24 || h.subnet.Bits() < 8 {
		return nil, fmt.Errorf("network subnet %s: an IPv4 prefix of /8 to /24 is needed (a /30 per sandbox)", h.subnet)
	}
	h.subnet = h.subnet.Masked()
	if h.limits.Connections <= 0 {
		h.limits.Connections = DefaultConnections
	}
	if h.limits.DNSRate.N == 0 {
		h.limits.DNSRate = DefaultDNSRate
	}
	if h.limits.ConnectionRate.N == 0 {
		h.limits.ConnectionRate = DefaultConnectionRate
	}
	for _, r := range []Rate{h.limits.DNSRate, h.limits.ConnectionRate} {
		if r.Per != time.Second && r.Per != time.Minute && r.Per != time.Hour {
			return nil, fmt.Errorf("a network rate is per second, minute or hour, not per %v", r.Per)
		}
	}
	servers, search := resolvConf("/etc/resolv.conf")
	if h.upstream == nil {
		h.upstream = servers
	}
	// The host's search domains are its network's names: in Kubernetes
	// the cluster's (namespace.svc.cluster.local, or a cluster domain of
	// its own), elsewhere often a site's internal domain.
	local, err := zoneNames(cfg.LocalZones)
	if err != nil {
		return nil, err
	}
	h.local = append(search, local...)
	// Whether the kernel has nftables at all, without changing anything:
	// the host's table is made when the first sandbox needs it.
	if _, err := mappedInterfaces(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	for i, u := range h.upstream {
		if _, _, err := net.SplitHostPort(u); err != nil {
			u = net.JoinHostPort(u, "53")
		}
		if _, err := netip.ParseAddrPort(u); err != nil {
			return nil, fmt.Errorf("DNS upstream %q is not an IP address with an optional port", cfg.Upstream[i])
		}
		h.upstream[i] = u
	}
	return h, nil
}

// Egress is what the proxy needs beyond its configuration, from the
// daemon's state directory.
type Egress struct {
	// CA issues the certificates of the HTTPS it intercepts for request
	// rules (intercept.go), and Secrets gives the values of the rules'
	// placeholders; until they are set such requests are refused.
	CA      *CA
	Secrets func(name string) (string, error)
	// Audit receives every egress decision, for the sandbox it names
	// (its trail); nil: none is kept.
	Audit func(sandbox string, e audit.Event)
}

// UseEgress gives the proxy e. Call it before the first sandbox is
// attached.
func (h *Host) UseEgress(e Egress) {
	h.ca, h.secrets, h.audit = e.CA, e.Secrets, e.Audit
}

// Subnet is where the sandboxes' veth pairs are numbered.
func (h *Host) Subnet() netip.Prefix { return h.subnet }

// special reports whether a is reserved, the host's own, or in the
// sandboxes' subnet: closed unless an address rule opens it.
func (h *Host) special(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() || h.subnet.Contains(a) {
		return true
	}
	for _, p := range reserved {
		if p.Contains(a) {
			return true
		}
	}
	for _, own := range h.ownAddrs() {
		if own == a {
			return true
		}
	}
	return false
}

func (h *Host) ownAddrs() []netip.Addr {
	h.addrsMu.Lock()
	defer h.addrsMu.Unlock()
	if time.Since(h.addrsAt) < addrsTTL {
		return h.addrs
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return h.addrs // the last known; reserved ranges still hold
	}
	// A new slice, never the old one refilled: callers range over the
	// one returned before without the lock, and one rewritten under them
	// could miss a host address (and let a connection to it through).
	addrs := make([]netip.Addr, 0, len(ifaddrs))
	for _, ia := range ifaddrs {
		if n, ok := ia.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				addrs = append(addrs, a.Unmap())
			}
		}
	}
	h.addrs, h.addrsAt = addrs, time.Now()
	return addrs
}

// Attachment is one sandbox's network: its namespace, veth pair, table,
// proxy and resolver, and its policy.
type Attachment struct {
	host   *Host
	slot   int
	locked bool // holds slot (claimSlot)
	ns     *os.File
	link   link
	ports  ports // in the host's table once set
	pol    atomic.Pointer[compiled]
	filter filter
	proxy  *proxy
	dns    *resolver
	// log names the sandbox, and id is its id; Name replaces them while
	// the proxy and the resolver run.
	log atomic.Pointer[slog.Logger]
	id  atomic.Pointer[string]
	// used counts the bytes its connections carried; spent is set once
	// they pass the host's budget, for good.
	used  atomic.Int64
	spent atomic.Bool

	closeOnce sync.Once
	closeErr  error
}

// Attach makes a network for a sandbox under pol, whose mode must not be
// NetNone. The sandbox's processes must run in Namespace.
func (h *Host) Attach(ctx context.Context, id string, pol policy.Network) (a *Attachment, err error) {
	if err := pol.Validate(); err != nil {
		return nil, err
	}
	if pol.Mode == policy.NetNone {
		return nil, errors.New("a sandbox without a network needs no attachment")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a = &Attachment{host: h}
	a.Name(id)
	a.filter.special, a.filter.local = h.special, h.local
	a.pol.Store(compile(pol))
	if a.slot, err = claimSlot(h.slots()); err != nil {
		return nil, err
	}
	a.locked = true
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	// The slot first, then the table: a server that stops deletes the
	// table only while no slot is held (Close), so from here on it stays.
	if err := ensureTable(); err != nil {
		return nil, err
	}
	a.link = linkOf(h.subnet, a.slot)
	// What a crashed daemon, or the kernel still tearing down the last
	// sandbox of this slot, left goes first.
	if left, err := leftPorts(a.link.hostIf); err != nil {
		return a, err
	} else if left {
		if err := removePorts(a.link.hostIf); err != nil {
			return a, err
		}
	}
	if err := removeLink(a.link.hostIf); err != nil {
		return a, err
	}
	if a.ns, err = newNetns(); err != nil {
		return a, err
	}
	if err := a.link.create(a.ns); err != nil {
		return a, err
	}
	if err := a.serve(ctx, ports{}); err != nil {
		return a, err
	}
	a.logger().Info("network attached", "mode", string(pol.Mode), "interface", a.link.hostIf, "address", a.link.sandboxIP)
	return a, nil
}

// serve starts a's proxy and resolver on the ports of at, or on new
// ones where at has none, and redirects the sandbox's traffic to them:
// at's are already (Adopt).
func (a *Attachment) serve(ctx context.Context, at ports) error {
	h := a.host
	// The daemon's listeners, on the host's end of the pair and bound to
	// that interface: nothing from another interface reaches them.
	lc := net.ListenConfig{Control: bindToDevice(a.link.hostIf)}
	on := func(port uint16) string { return net.JoinHostPort(a.link.hostIP.String(), strconv.Itoa(int(port))) }
	pln, err := lc.Listen(ctx, "tcp4", on(at.proxy))
	if err != nil {
		return fmt.Errorf("proxy listener: %w", err)
	}
	a.proxy = newProxy(a, pln, h.limits)
	dpc, err := lc.ListenPacket(ctx, "udp4", on(at.dnsUDP))
	if err != nil {
		pln.Close()
		return fmt.Errorf("resolver listener: %w", err)
	}
	dln, err := lc.Listen(ctx, "tcp4", on(at.dnsTCP))
	if err != nil {
		pln.Close()
		dpc.Close()
		return fmt.Errorf("resolver listener: %w", err)
	}
	a.dns = newResolver(a, h.upstream, h.limits.DNSRate)
	go a.proxy.serve()
	a.dns.serve(dpc, dln)
	if at != (ports{}) {
		a.ports = at
		return nil
	}
	// Last: from now on the sandbox's traffic is redirected to them.
	p := ports{proxy: port(pln.Addr()), dnsUDP: port(dpc.LocalAddr()), dnsTCP: port(dln.Addr())}
	if err := addPorts(a.link.hostIf, p, h.limits); err != nil {
		return err
	}
	a.ports = p
	return nil
}

// Handle names the network for a later process's Adopt: its slot, and
// the ports its traffic is redirected to.
func (a *Attachment) Handle() string {
	return fmt.Sprintf("%d:%d:%d:%d", a.slot, a.ports.proxy, a.ports.dnsUDP, a.ports.dnsTCP)
}

// Adopt takes back the network a sandbox still runs in that an earlier
// process made (live restore), which handle (Handle) names: its veth
// pair, whose sandbox end is in ns (the sandbox's namespace, which Close
// closes), under pol. The earlier process's proxy and resolver died with
// it, and with them the sandbox's open connections: new ones listen on
// their ports, to which the host's table still redirects its traffic
// (or, should one be taken, on new ones, redirected anew). The slot's
// lock must be this process's to take: held by a description this
// process adopted (rangelock.Locks.Adopt), or free.
func (h *Host) Adopt(ctx context.Context, id, handle string, ns *os.File, pol policy.Network) (a *Attachment, err error) {
	if err := pol.Validate(); err != nil {
		ns.Close()
		return nil, err
	}
	var slot int
	var at ports
	if n, err := fmt.Sscanf(handle, "%d:%d:%d:%d", &slot, &at.proxy, &at.dnsUDP, &at.dnsTCP); err != nil || n != 4 || pol.Mode == policy.NetNone {
		ns.Close()
		return nil, fmt.Errorf("not a network to take back: %q", handle)
	}
	if slot < 1 || slot >= h.slots() {
		ns.Close()
		return nil, fmt.Errorf("network slot %d is outside the subnet", slot)
	}
	if err := slotLocks.TryLock(int64(slot)); err != nil {
		ns.Close()
		return nil, fmt.Errorf("network slot %d: %w", slot, err)
	}
	a = &Attachment{host: h, slot: slot, locked: true, ns: ns, link: linkOf(h.subnet, slot)}
	a.Name(id)
	a.filter.special, a.filter.local = h.special, h.local
	a.pol.Store(compile(pol))
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if err := a.link.check(ns); err != nil {
		return a, err
	}
	if err := ensureTable(); err != nil {
		return a, err
	}
	// Its elements, as addPorts made them, exactly when its chain of
	// limits is there (leftPorts).
	if kept, err := leftPorts(a.link.hostIf); err != nil {
		return a, err
	} else if !kept {
		at = ports{}
	}
	if err := a.serve(ctx, at); err != nil && at != (ports{}) {
		// A port taken while no daemon ran, by a process of the host
		// (SECURITY.md's known gaps): new ones, redirected anew.
		a.logger().Warn("a sandbox's proxy or resolver port was taken while no daemon ran: redirected to new ones", "interface", a.link.hostIf, "err", err)
		a.closeListeners()
		if err := removePorts(a.link.hostIf); err != nil {
			return a, err
		}
		err = a.serve(ctx, ports{})
		if err != nil {
			return a, err
		}
	} else if err != nil {
		return a, err
	}
	a.logger().Info("network taken back", "mode", string(pol.Mode), "interface", a.link.hostIf, "address", a.link.sandboxIP)
	return a, nil
}

// closeListeners stops a's proxy and resolver, if they run.
func (a *Attachment) closeListeners() {
	if a.proxy != nil {
		a.proxy.close()
		a.proxy = nil
	}
	if a.dns != nil {
		a.dns.close()
		a.dns = nil
	}
}

// SlotLocks are the locks of every airlock process's network slots: a
// keeper holds them so that a daemon's sandboxes' networks outlive it
// (internal/backend/namespaces).
func SlotLocks() *rangelock.Locks { return slotLocks }

// Close deletes the host's table unless a sandbox has a network now, of
// this process or of another airlock on the host: a server that stops
// leaves nothing in the host's nftables. Call it once h's sandboxes are
// gone; a later Attach makes the table again. The veth pairs of ended
// sandboxes go first (Cleanup), as the kernel deletes them only when it
// gets to their namespaces, in the background.
func (h *Host) Close() error {
	if err := h.Cleanup(); err != nil {
		return err
	}
	return dropUnusedTable()
}

// Namespace is the sandbox's network namespace.
func (a *Attachment) Namespace() *os.File { return a.ns }

// Name names the sandbox the network is for in its log lines from now
// on: a pool's network is made before the sandbox it becomes has its id,
// and a refusal logged under the pool's name could not be traced to it.
func (a *Attachment) Name(id string) {
	a.log.Store(a.host.log.With("sandbox", id))
	a.id.Store(&id)
}

// auditing reports whether a's decisions are written down.
func (a *Attachment) auditing() bool { return a.host.audit != nil }

// record writes e down in the sandbox's audit trail, if there is one.
func (a *Attachment) record(e audit.Event) {
	if id := a.id.Load(); a.host.audit != nil && id != nil {
		e.Time = time.Now()
		a.host.audit(*id, e)
	}
}

// spend counts n bytes against the host's budget and reports whether
// they fit. The first to pass it ends the sandbox's egress: its trail
// says why, and its open connections are cut.
func (a *Attachment) spend(n int) bool {
	if a.host.budget <= 0 {
		return true
	}
	if a.used.Add(int64(n)) <= a.host.budget {
		return true
	}
	if !a.spent.Swap(true) {
		a.logger().Info("egress budget spent", "bytes", a.host.budget)
		a.record(audit.Event{Kind: "budget", Decision: "denied", Rule: fmt.Sprintf("egress budget of %d bytes spent", a.host.budget), Sent: a.used.Load()})
		go a.proxy.cutAll("egress budget spent")
	}
	return false
}

func (a *Attachment) logger() *slog.Logger { return a.log.Load() }

// Address is the sandbox's address on its interface.
func (a *Attachment) Address() netip.Addr { return a.link.sandboxIP }

// Policy is the sandbox's network policy now.
func (a *Attachment) Policy() policy.Network { return a.pol.Load().Network }

func (a *Attachment) policy() *compiled { return a.pol.Load() }

// Update replaces the sandbox's policy at once: connections it opens from
// now on follow pol, and open ones that pol does not allow are cut. The
// interface stays: pol's mode must not be NetNone.
func (a *Attachment) Update(pol policy.Network) error {
	if err := pol.Validate(); err != nil {
		return err
	}
	if pol.Mode == policy.NetNone {
		return errors.New("a sandbox's interface cannot be removed: deny everything instead")
	}
	a.pol.Store(compile(pol))
	a.proxy.recheck()
	a.logger().Info("network policy updated", "mode", string(pol.Mode), "allow", len(pol.AllowOut), "deny", len(pol.DenyOut))
	return nil
}

// Close removes the network; the sandbox must be gone. Its map elements
// go first (nothing is redirected any more, so the host's rules drop
// whatever it might still send), then the listeners and connections, then
// the namespace: with its last holder gone the kernel deletes it and the
// veth pair in it, in the background (deleting the pair here would wait
// for RCU grace periods, ~20 ms on these hosts, on every teardown). The
// slot is free again only if the elements are gone; otherwise a later
// Cleanup retries.
func (a *Attachment) Close() error {
	a.closeOnce.Do(func() {
		var errs []error
		if a.ports != (ports{}) {
			if err := deletePorts(a.link.hostIf, a.ports); err != nil {
				errs = append(errs, err)
			}
		}
		a.closeListeners()
		if a.ns != nil {
			a.ns.Close()
		}
		if a.locked && len(errs) == 0 {
			slotLocks.Unlock(int64(a.slot))
		}
		a.closeErr = errors.Join(errs...)
	})
	return a.closeErr
}

// Cleanup removes the map elements and veth pairs of sandboxes whose
// daemon died: those whose slot nobody holds. Live sandboxes, of this
// process or another, are untouched.
func (h *Host) Cleanup() error {
	var errs []error
	mapped, err := mappedInterfaces()
	if err != nil {
		errs = append(errs, err)
	}
	names, err := links(linkPrefix)
	if err != nil {
		errs = append(errs, fmt.Errorf("list interfaces: %w", err))
	}
	for i, n := range append(mapped, names...) {
		slot, ok := slotOf(n)
		if !ok {
			continue
		}
		if slotLocks.TryLock(int64(slot)) != nil {
			continue // alive, or a lock we cannot take: leave it
		}
		if i < len(mapped) {
			err = removePorts(n)
		} else {
			err = removeLink(n)
		}
		if err != nil {
			errs = append(errs, err)
		}
		slotLocks.Unlock(int64(slot))
	}
	return errors.Join(errs...)
}

// linkOf is the veth pair of slot: the slot's /30 of subnet, whose
// first address is the host's end and second the sandbox's.
func linkOf(subnet netip.Prefix, slot int) link {
	base := subnet.Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	n += uint32(slot) * 4
	return link{
		hostIf:    fmt.Sprintf("%s%04x", linkPrefix, slot),
		hostIP:    netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n + 1)}),
		sandboxIP: netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n + 2)}),
		bits:      30,
	}
}

// linkPrefix names the host's ends of sandboxes' veth pairs.
const linkPrefix = "al-"

// slots is how many /30s the subnet holds; slot 0 is never used (its
// first address would be the subnet's own).
func (h *Host) slots() int { return min(1<<(32-h.subnet.Bits())/4, 1<<16) }

// slotLockFile holds a byte-range lock per slot in use, taken by every
// airlock process on the host: two sandboxes never share addresses,
// interface or table names, and a crash frees its slots (the kernel drops
// the locks of a dead process). A process takes them all through one
// open description (rangelock): a slot costs no descriptor.
const slotLockFile = "/run/airlock-net.lock"

var slotLocks = &rangelock.Locks{Path: slotLockFile}

// claimSlot takes a free slot of n (slot 0 is never one), starting at a
// random one: a slot just freed may still hold a veth pair the kernel is
// deleting.
func claimSlot(n int) (int, error) {
	start := rand.IntN(n - 1)
	for i := range n - 1 {
		slot := 1 + (start+i)%(n-1)
		switch err := slotLocks.TryLock(int64(slot)); {
		case err == nil:
			return slot, nil
		case !errors.Is(err, rangelock.ErrBusy):
			return 0, fmt.Errorf("network slot lock: %w", err)
		}
	}
	return 0, fmt.Errorf("no free network slot: the subnet holds %d sandboxes", n-1)
}

func bindToDevice(name string) func(string, string, syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), name) }); err != nil {
			return err
		}
		return serr
	}
}

func port(a net.Addr) uint16 {
	switch a := a.(type) {
	case *net.TCPAddr:
		return uint16(a.Port)
	case *net.UDPAddr:
		return uint16(a.Port)
	}
	return 0
}
