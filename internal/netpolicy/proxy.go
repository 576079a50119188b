package netpolicy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// proxy receives every TCP connection a sandbox opens (its nftables
// table redirects them here), decides it, and relays the allowed ones
// from the host. The host, not the sandbox, dials: no packet of the
// sandbox is ever routed anywhere.
type proxy struct {
	a      *Attachment
	ln     net.Listener
	dialer net.Dialer
	slots  chan struct{} // one per connection open at once
	up     *rate.Limiter // bytes per second, sandbox to outside; nil: no limit
	down   *rate.Limiter // outside to sandbox

	mu    sync.Mutex
	conns map[*relay]struct{}
	wg    sync.WaitGroup
}

// relay is one allowed connection and what it was allowed for.
type relay struct {
	in, out net.Conn
	dst     netip.AddrPort
	name    string
}

const dialTimeout = 10 * time.Second

func newProxy(a *Attachment, ln net.Listener, limits Limits) *proxy {
	p := &proxy{a: a, ln: ln, dialer: net.Dialer{Timeout: dialTimeout}, slots: make(chan struct{}, limits.Connections), conns: map[*relay]struct{}{}}
	if limits.Bandwidth > 0 {
		// An eighth of a second's worth at once, and at least what one
		// read of pipe's buffer carries.
		burst := int(max(limits.Bandwidth/8, 64<<10))
		p.up = rate.NewLimiter(rate.Limit(limits.Bandwidth), burst)
		p.down = rate.NewLimiter(rate.Limit(limits.Bandwidth), burst)
	}
	return p
}

// serve accepts until the listener is closed.
func (p *proxy) serve() {
	p.wg.Add(1)
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: let them pass
			continue
		}
		select {
		case p.slots <- struct{}{}:
		default:
			p.a.log.Info("connection refused", "why", "too many connections open")
			reset(c)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.slots }()
			p.handle(c)
		}()
	}
}

// close stops accepting and cuts every connection.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for r := range p.conns {
		r.in.Close()
		r.out.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) handle(in net.Conn) {
	dst, err := originalDst(in)
	if err != nil {
		p.a.log.Warn("connection without a destination", "err", err)
		reset(in)
		return
	}
	pol := p.a.policy()
	var name string
	var head []byte
	// The name matters only for HTTP and TLS ports, and only when the
	// policy has name rules; anything else is decided by address alone.
	if (dst.Port() == httpPort || dst.Port() == httpsPort) && hasNameRules(pol) {
		if v := p.a.filter.check(pol, dst.Addr(), dst.Port(), ""); !v.allow && p.a.filter.special(dst.Addr()) {
			p.refuse(in, dst, "", v.reason) // no name opens a reserved address
			return
		}
		if name, head, err = sniffName(in, dst.Port()); err != nil {
			reset(in)
			return
		}
	}
	if v := p.a.filter.check(pol, dst.Addr(), dst.Port(), name); !v.allow {
		p.refuse(in, dst, name, v.reason)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	out, err := p.dialer.DialContext(ctx, "tcp4", dst.String())
	cancel()
	if err != nil {
		p.a.log.Info("connection failed", "dst", dst, "name", name, "err", err)
		reset(in)
		return
	}
	r := &relay{in: in, out: out, dst: dst, name: name}
	if !p.track(r) {
		in.Close()
		out.Close()
		return
	}
	defer p.untrack(r)
	if len(head) > 0 {
		if _, err := out.Write(head); err != nil {
			in.Close()
			out.Close()
			return
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); pipe(out, in, p.up) }()
	pipe(in, out, p.down)
	wg.Wait()
	in.Close()
	out.Close()
}

func (p *proxy) refuse(in net.Conn, dst netip.AddrPort, name, why string) {
	p.a.log.Info("connection refused", "dst", dst, "name", name, "why", why)
	reset(in)
}

// track registers r, unless the policy changed while it was being
// dialed and no longer allows it.
func (p *proxy) track(r *relay) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v := p.a.filter.check(p.a.policy(), r.dst.Addr(), r.dst.Port(), r.name); !v.allow {
		return false
	}
	p.conns[r] = struct{}{}
	return true
}

func (p *proxy) untrack(r *relay) {
	p.mu.Lock()
	delete(p.conns, r)
	p.mu.Unlock()
}

// recheck cuts the connections the current policy no longer allows.
func (p *proxy) recheck() {
	p.mu.Lock()
	defer p.mu.Unlock()
	pol := p.a.policy()
	for r := range p.conns {
		if v := p.a.filter.check(pol, r.dst.Addr(), r.dst.Port(), r.name); !v.allow {
			p.a.log.Info("connection cut", "dst", r.dst, "name", r.name, "why", v.reason)
			reset(r.in)
			r.out.Close()
		}
	}
}

// pipe copies src to dst within the limiter's rate, then half-closes
// dst so the far side sees the end of what was sent.
func pipe(dst, src net.Conn, lim *rate.Limiter) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if lim != nil {
				_ = lim.WaitN(context.Background(), n)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				tc.CloseWrite()
			} else {
				dst.Close()
			}
			return
		}
	}
}

// reset closes c with a TCP reset: the client sees "connection reset"
// at once rather than a clean end it might mistake for an answer.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// originalDst is where the sandbox meant c to go, before nftables
// redirected it here (SO_ORIGINAL_DST). The kernel answers with a
// sockaddr_in; IPv6Mreq is a 20-byte buffer that holds it.
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa *unix.IPv6Mreq
	var serr error
	if err := raw.Control(func(fd uintptr) {
		sa, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", serr)
	}
	b := sa.Multiaddr // family (2, host order), port (2, network order), address (4)
	if binary.NativeEndian.Uint16(b[0:2]) != unix.AF_INET {
		return netip.AddrPort{}, errors.New("not an IPv4 destination")
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4])), nil
}
