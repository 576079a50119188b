package netpolicy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/audit"
)

// proxy receives every TCP connection a sandbox opens (the host's
// nftables rules redirect them here), decides it, and relays the allowed
// ones from the host. The host, not the sandbox, dials: no packet of the
// sandbox is ever routed anywhere.
type proxy struct {
	a      *Attachment
	ln     net.Listener
	dialer net.Dialer
	slots  chan struct{} // one per connection open at once
	up     *rate.Limiter // bytes per second, sandbox to outside; nil: no limit
	down   *rate.Limiter // outside to sandbox
	ctx    context.Context
	cancel context.CancelFunc // at close: dials under way give up

	mu     sync.Mutex
	closed bool
	conns  map[*relay]struct{} // every connection accepted and not ended
	wg     sync.WaitGroup

	accepted atomic.Int64 // connections that reached the daemon
}

// relay is one connection from the sandbox and what it was allowed for.
type relay struct {
	in   net.Conn
	dst  netip.AddrPort
	out  net.Conn // nil until dialed; for HTTP, the transport's own
	name string   // the name it was allowed for; for HTTP, the last request's
	http *http.Transport
	// seen is the name it presented where none is judged (no name rules):
	// for its audit trail only.
	seen string
	// For the audit trail: when it came, and the bytes it carried each
	// way (from the sandbox, to it).
	start          time.Time
	sent, received atomic.Int64
}

// proto names r's protocol in its audit trail.
func (r *relay) proto() string {
	switch r.dst.Port() {
	case httpPort:
		return "http"
	case httpsPort:
		return "https"
	}
	return "tcp"
}

// audit writes r down, once it ended or was refused.
func (p *proxy) audit(r *relay, decision, why string) {
	if !p.a.auditing() {
		return
	}
	name := r.name
	if name == "" {
		name = r.seen
	}
	p.a.record(audit.Event{Kind: "connection", Proto: r.proto(), Name: name, Addr: r.dst.Addr().String(), Port: r.dst.Port(),
		Decision: decision, Rule: why, Sent: r.sent.Load(), Received: r.received.Load(),
		Millis: float64(time.Since(r.start).Microseconds()) / 1000})
}

const (
	dialTimeout = 10 * time.Second
	// halfClosedIdle bounds how long a connection the sandbox has
	// finished sending on may wait for the far side to speak or close.
	halfClosedIdle = 2 * time.Minute
)

func newProxy(a *Attachment, ln net.Listener, limits Limits) *proxy {
	p := &proxy{a: a, ln: ln, dialer: net.Dialer{Timeout: dialTimeout}, slots: make(chan struct{}, limits.Connections), conns: map[*relay]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	if limits.Bandwidth > 0 {
		// An eighth of a second's worth at once, and at least one
		// read's worth (limitedConn reads at most 32 KiB).
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
		p.accepted.Add(1)
		select {
		case p.slots <- struct{}{}:
		default:
			p.a.logger().Info("connection refused", "why", "too many connections open")
			reset(c)
			continue
		}
		r := &relay{in: c, start: time.Now()}
		if !p.track(r) {
			<-p.slots
			reset(c)
			continue
		}
		go func() {
			defer p.wg.Done()
			defer func() { <-p.slots }()
			defer p.untrack(r)
			p.handle(r)
		}()
	}
}

// track registers r, unless the proxy is closing; wg counts it.
func (p *proxy) track(r *relay) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[r] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *proxy) untrack(r *relay) {
	p.mu.Lock()
	delete(p.conns, r)
	p.mu.Unlock()
	r.in.Close()
	if r.out != nil {
		r.out.Close()
	}
	if r.http != nil {
		r.http.CloseIdleConnections()
	}
}

// close stops accepting and cuts every connection, being sniffed,
// dialed or relayed, and waits until all are gone.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.cancel()
	for r := range p.conns {
		r.in.Close()
		if r.out != nil {
			r.out.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// setOut records r's outgoing connection, unless the proxy closed or the
// policy changed while it was being dialed and no longer allows it.
func (p *proxy) setOut(r *relay, out net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || !p.a.filter.check(p.a.policy(), r.dst.Addr(), r.dst.Port(), r.name).allow {
		return false
	}
	r.out = out
	return true
}

// cutAll cuts every connection, for why.
func (p *proxy) cutAll(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for r := range p.conns {
		p.a.logger().Info("connection cut", "dst", r.dst, "name", r.name, "why", why)
		reset(r.in)
		if r.out != nil {
			r.out.Close()
		}
	}
}

// recheck cuts the connections the current policy no longer allows.
func (p *proxy) recheck() {
	p.mu.Lock()
	defer p.mu.Unlock()
	pol := p.a.policy()
	for r := range p.conns {
		if r.out == nil && r.http == nil {
			continue // not decided yet: setOut checks the new policy
		}
		if v := p.a.filter.check(pol, r.dst.Addr(), r.dst.Port(), r.name); !v.allow {
			p.a.logger().Info("connection cut", "dst", r.dst, "name", r.name, "why", v.reason)
			reset(r.in)
			if r.out != nil {
				r.out.Close()
			}
		}
	}
}

func (p *proxy) handle(r *relay) {
	dst, err := originalDst(r.in)
	if err != nil {
		p.a.logger().Warn("connection without a destination", "err", err)
		reset(r.in)
		return
	}
	r.dst = dst
	if p.a.spent.Load() {
		p.refuse(r, "the sandbox's egress budget is spent")
		return
	}
	pol := p.a.policy()
	// Name rules, and request rules, need the name each connection is for.
	names := hasNameRules(pol) || len(pol.Rules) > 0
	// What no name could open is decided at once: a name opens an
	// address only where the resolver pinned it, and never a reserved one.
	if v := p.a.filter.check(pol, dst.Addr(), dst.Port(), ""); !v.allow && (p.a.filter.special(dst.Addr()) || !p.a.filter.pins.hasAddr(dst.Addr())) {
		p.refuse(r, v.reason)
		return
	}
	// Plain HTTP under name rules is judged request by request: the
	// Host of every request on the connection, not only the first.
	if dst.Port() == httpPort && names {
		p.serveHTTP(r, p.limited(r), false)
		return
	}
	var head []byte
	switch {
	case dst.Port() == httpsPort && names:
		if r.name, head, err = sniffName(r.in, dst.Port()); err != nil {
			reset(r.in)
			return
		}
		// A policy that denies names cannot let a connection through
		// whose name it cannot read (TLS without a server name).
		if r.name == "" && hasDenyNames(pol) {
			p.refuse(r, "no server name, and denyOut names some")
			return
		}
	case (dst.Port() == httpsPort || dst.Port() == httpPort) && p.a.auditing():
		// Read for the trail (learning mode's allowlist is of names), not
		// judged: the policy has no names.
		if r.seen, head, err = sniffName(r.in, dst.Port()); err != nil {
			reset(r.in)
			return
		}
	}
	if v := p.a.filter.check(pol, dst.Addr(), dst.Port(), r.name); !v.allow {
		p.refuse(r, v.reason)
		return
	}
	if dst.Port() == httpsPort && r.name != "" && pol.TransformsFor(r.name) != nil {
		p.intercept(r, head)
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	out, err := p.dial(ctx, dst)
	cancel()
	if err != nil {
		p.a.logger().Info("connection failed", "dst", dst, "name", r.name, "err", err)
		reset(r.in)
		return
	}
	if !p.setOut(r, out) {
		out.Close()
		p.refuse(r, "the policy changed while it was dialed, and no longer allows it")
		return
	}
	defer func() { p.audit(r, "allowed", "") }()
	if len(head) > 0 {
		if !p.a.spend(len(head)) {
			return
		}
		r.sent.Add(int64(len(head)))
		if _, err := out.Write(head); err != nil {
			return
		}
	}
	in := p.limited(r)
	// Once the sandbox has said all it will, the far side gets
	// halfClosedIdle between reads to answer or close.
	var sent atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipe(in, out, &sent)
	}()
	pipe(out, in, nil)
	sent.Store(true)
	out.SetReadDeadline(time.Now().Add(halfClosedIdle))
	<-done
}

// serveHTTP relays an HTTP connection request by request, each
// request's Host checked against the policy and the resolver's pins and
// changed by the rules for it (intercept.go); a refused request is
// answered 403 and the connection closed. in is the sandbox's side: the
// plain connection, or for an intercepted one (secure) the TLS server
// over it, whose requests must all be for r.name and go on over TLS.
func (p *proxy) serveHTTP(r *relay, in net.Conn, secure bool) {
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			return p.dial(ctx, r.dst)
		},
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return p.upstreamTLS(ctx, r)
		},
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     halfClosedIdle,
		DisableCompression:  true,
	}
	p.mu.Lock()
	r.http = transport // recheck reads it under the lock
	p.mu.Unlock()
	rp := &httputil.ReverseProxy{
		// After the hop-by-hop headers (those the sandbox's Connection
		// names among them) are gone: the rules' headers are set last.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", r.dst.String()
			if secure {
				pr.Out.URL.Scheme = "https"
			}
			pr.Out.Host = pr.In.Host
			if ap, ok := pr.In.Context().Value(appliedKey{}).(*applied); ok {
				ap.apply(pr.Out)
			}
		},
		Transport:      transport,
		FlushInterval:  -1,
		ModifyResponse: maskResponse,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "the server did not answer", http.StatusBadGateway)
		},
	}
	// A handler may outlive Serve: an upgraded connection (a websocket)
	// is the handler's until it ends.
	var active sync.WaitGroup
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		active.Add(1)
		defer active.Done()
		name := req.Host
		if h, _, err := net.SplitHostPort(name); err == nil {
			name = h
		}
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		pol := p.a.policy()
		v := p.a.filter.check(pol, r.dst.Addr(), r.dst.Port(), name)
		ctx := p.ctx // the proxy's close ends the request
		switch ts := pol.TransformsFor(name); {
		case v.allow && name == "" && hasDenyNames(pol):
			v = verdict{false, "no Host, and denyOut names some"}
		case secure && name != r.name:
			// The rules, and the certificate, are r.name's.
			v = verdict{false, "a request for another host than the connection's"}
		case v.allow && ts != nil:
			ap, err := p.fill(ts)
			switch {
			case err != nil:
				v = verdict{false, err.Error()}
			case len(ap.secrets) > 0 && !secure:
				v = verdict{false, "a rule's secret goes only over HTTPS"}
			default:
				ctx = context.WithValue(ctx, appliedKey{}, ap)
			}
		}
		p.mu.Lock()
		if v.allow && !p.closed {
			r.name = name
		}
		closed := p.closed
		p.mu.Unlock()
		e := audit.Event{Kind: "request", Proto: "http", Name: name, Addr: r.dst.Addr().String(), Port: r.dst.Port(), Decision: "allowed"}
		if secure {
			e.Proto = "https"
		}
		start := time.Now()
		defer func() {
			e.Millis = float64(time.Since(start).Microseconds()) / 1000
			p.a.record(e)
		}()
		if !v.allow || closed {
			p.a.logger().Info("request refused", "dst", r.dst, "name", name, "why", v.reason)
			w.Header().Set("Connection", "close")
			http.Error(w, "refused by the sandbox's network policy: "+v.reason, http.StatusForbidden)
			e.Decision, e.Rule, e.Status = "denied", v.reason, http.StatusForbidden
			return
		}
		ap, _ := ctx.Value(appliedKey{}).(*applied)
		e.Intercepted = secure || ap != nil
		sw := &statusWriter{ResponseWriter: w}
		if ap != nil {
			sw.secrets = ap.secrets
		}
		rp.ServeHTTP(sw, req.WithContext(ctx))
		// Trailers are sent from the header once the handler returns.
		maskHeader(w.Header(), sw.secrets)
		e.Status = sw.status
	})
	ln := &oneConnListener{c: in, done: make(chan struct{})}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: sniffTimeout, IdleTimeout: halfClosedIdle,
		MaxHeaderBytes: maxSniff, ErrorLog: log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				ln.Close()
			}
		}}
	srv.Serve(ln)
	active.Wait()
	p.audit(r, "allowed", "")
}

// statusWriter remembers the status of an answer, for the audit trail;
// Unwrap lets http.ResponseController (the reverse proxy's flushes and
// upgrades) reach the writer beneath.
type statusWriter struct {
	http.ResponseWriter
	status  int
	secrets [][]byte // masked in every header sent, 1xx ones too
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	maskHeader(w.Header(), w.secrets)
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// oneConnListener hands out one connection, then waits to be closed.
type oneConnListener struct {
	c      net.Conn
	given  bool
	done   chan struct{}
	closer sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if !l.given {
		l.given = true
		return l.c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.closer.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

func (p *proxy) refuse(r *relay, why string) {
	p.a.logger().Info("connection refused", "dst", r.dst, "name", r.name, "why", why)
	reset(r.in)
	p.audit(r, "denied", why)
}

// limited wraps the sandbox's side of r in the bandwidth limits, if there
// are any, and counts what it carries (the audit trail, the budget).
func (p *proxy) limited(r *relay) net.Conn {
	var c net.Conn = &countedConn{Conn: r.in, r: r, a: p.a}
	if p.up == nil {
		return c
	}
	return &limitedConn{Conn: c, read: p.up, write: p.down}
}

// countedConn counts the bytes of a relay's sandbox side, and ends it once
// the sandbox's budget is spent.
type countedConn struct {
	net.Conn
	r *relay
	a *Attachment
}

// errSpent ends a connection past the sandbox's budget.
var errSpent = errors.New("the sandbox's egress budget is spent")

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.r.sent.Add(int64(n))
	if n > 0 && !c.a.spend(n) {
		return 0, errSpent
	}
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	if !c.a.spend(len(b)) {
		return 0, errSpent
	}
	n, err := c.Conn.Write(b)
	c.r.received.Add(int64(n))
	return n, err
}

// CloseWrite half-closes the sandbox's side, as pipe expects.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// limitedConn reads (the sandbox sending) and writes (the sandbox
// receiving) at most at its limiters' rates.
type limitedConn struct {
	net.Conn
	read, write *rate.Limiter
}

func (c *limitedConn) Read(b []byte) (int, error) {
	if len(b) > 32<<10 {
		b = b[:32<<10]
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		_ = c.read.WaitN(context.Background(), n)
	}
	return n, err
}

func (c *limitedConn) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), 32<<10)]
		_ = c.write.WaitN(context.Background(), len(chunk))
		n, err := c.Conn.Write(chunk)
		written += n
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}

// CloseWrite half-closes the sandbox's side, as pipe expects.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// pipe copies src to dst, then half-closes dst so the far side sees the
// end of what was sent. Once idle is set, src must speak within
// halfClosedIdle of each read.
func pipe(dst, src net.Conn, idle *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		if idle != nil && idle.Load() {
			src.SetReadDeadline(time.Now().Add(halfClosedIdle))
		}
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && errors.Is(err, io.EOF) {
				cw.CloseWrite()
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
