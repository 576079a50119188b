package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sandboxIf is the sandbox's end of its veth pair, in its namespace.
const sandboxIf = "eth0"

// newNetns creates a network namespace, owned by the host's user
// namespace (so that nothing in the sandbox, root or not, may change its
// interfaces, addresses or routes), in which interfaces are made without
// IPv6. The returned file holds it: it ends when that file is closed and
// no process is left in it.
func newNetns() (*os.File, error) {
	type result struct {
		ns  *os.File
		err error
	}
	done := make(chan result, 1)
	// A goroutine of its own, whose thread enters the new namespace: if it
	// cannot come back, it exits locked and Go retires the thread rather
	// than run other goroutines in the wrong namespace.
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{nil, err}
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{nil, fmt.Errorf("new network namespace: %w", err)}
			return
		}
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err == nil {
			// /proc/sys/net is the namespace of the thread that opens it.
			err = os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0)
		}
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			if ns != nil {
				ns.Close()
			}
			done <- result{nil, fmt.Errorf("back to the host's network namespace: %w", serr)}
			return // still locked: the thread goes
		}
		runtime.UnlockOSThread()
		if err != nil && ns != nil {
			ns.Close()
			ns = nil
		}
		done <- result{ns, err}
	}()
	r := <-done
	return r.ns, r.err
}

// link is a sandbox's veth pair: hostIf in the daemon's namespace with
// hostIP, eth0 in the sandbox's with sandboxIP and a default route through
// hostIP.
type link struct {
	hostIf            string
	hostIP, sandboxIP netip.Addr
	bits              int
}

// create makes the pair and configures both ends; the sandbox's end in ns.
func (l *link) create(ns *os.File) error {
	la := netlink.NewLinkAttrs()
	la.Name = l.hostIf
	veth := &netlink.Veth{LinkAttrs: la, PeerName: sandboxIf, PeerNamespace: netlink.NsFd(int(ns.Fd()))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", l.hostIf, err)
	}
	// The host's end: no IPv6 (which would give it a link-local address
	// the sandbox could talk to), then its address, then up.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+l.hostIf+"/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("veth %s: disable IPv6: %w", l.hostIf, err)
	}
	host, err := netlink.LinkByName(l.hostIf)
	if err != nil {
		return fmt.Errorf("veth %s: %w", l.hostIf, err)
	}
	if err := netlink.AddrAdd(host, addr(l.hostIP, l.bits)); err != nil {
		return fmt.Errorf("veth %s: address: %w", l.hostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("veth %s: up: %w", l.hostIf, err)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("sandbox network namespace: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("sandbox loopback: %w", err)
	}
	eth, err := h.LinkByName(sandboxIf)
	if err == nil {
		err = h.AddrAdd(eth, addr(l.sandboxIP, l.bits))
	}
	if err == nil {
		err = h.LinkSetUp(eth)
	}
	if err == nil {
		err = h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(l.hostIP.AsSlice())})
	}
	if err != nil {
		return fmt.Errorf("sandbox interface: %w", err)
	}
	return nil
}

// check makes sure that the sandbox's end of the pair is in ns: a
// network taken back (Adopt) is the one the sandbox runs in, not another
// slot's. (Its address is no proof: gVisor's netstack takes it off the
// interface.)
func (l *link) check(ns *os.File) error {
	host, err := netlink.LinkByName(l.hostIf)
	if err != nil {
		return fmt.Errorf("veth %s: %w", l.hostIf, err)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("sandbox network namespace: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName(sandboxIf)
	if err != nil {
		return fmt.Errorf("sandbox interface: %w", err)
	}
	if eth.Attrs().ParentIndex != host.Attrs().Index {
		return fmt.Errorf("the sandbox's interface is not the peer of %s", l.hostIf)
	}
	return nil
}

// remove deletes the pair (both ends go with either), if it exists.
func removeLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("veth %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove veth %s: %w", name, err)
	}
	return nil
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}}
}

// links lists the daemon namespace's interfaces whose names start with prefix.
func links(prefix string) ([]string, error) {
	all, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range all {
		if n := l.Attrs().Name; len(n) > len(prefix) && n[:len(prefix)] == prefix {
			names = append(names, n)
		}
	}
	return names, nil
}
