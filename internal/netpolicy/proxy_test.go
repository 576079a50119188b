package netpolicy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// tcpPair is the two ends of a TCP connection on loopback.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// lab is an attachment whose filter takes loopback for the internet, as
// a test's fake hosts are, under pol; its proxy's listener is never
// dialed: the tests hand it connections.
func lab(t *testing.T, pol policy.Network) *Attachment {
	t.Helper()
	host := testHost()
	at := &Attachment{host: host}
	at.log.Store(slog.New(slog.DiscardHandler))
	at.filter.special = func(a netip.Addr) bool { return !a.IsLoopback() && host.special(a) }
	at.pol.Store(compile(pol))
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	at.proxy = newProxy(at, ln, Limits{Connections: 4})
	return at
}

// TestServeHTTPChecksEveryRequest: on plain HTTP under name rules, every
// request's Host is judged, not only the first's; a refused one is
// answered 403 with the reason and ends the connection; a policy that no
// longer allows the connection's name cuts it.
func TestServeHTTPChecksEveryRequest(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello "+r.Host+r.URL.Path)
	}))
	defer web.Close()
	dst := netip.MustParseAddrPort(strings.TrimPrefix(web.URL, "http://"))
	at := lab(t, policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, "allowed.test", "other.test")})
	at.filter.pins.add("allowed.test", dst.Addr(), time.Hour)
	at.filter.pins.add("other.test", dst.Addr(), time.Hour)
	p := at.proxy

	client, in := tcpPair(t)
	r := &relay{in: in, dst: dst}
	if !p.track(r) {
		t.Fatal("not tracked")
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer p.wg.Done()
		defer p.untrack(r)
		p.serveHTTP(r, in, false)
	}()
	br := bufio.NewReader(client)
	get := func(host, path string) (*http.Response, string) {
		t.Helper()
		if _, err := io.WriteString(client, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s%s: %v", host, path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	if resp, body := get("allowed.test", "/a"); resp.StatusCode != http.StatusOK || body != "hello allowed.test/a" {
		t.Errorf("an allowed name: %d %q", resp.StatusCode, body)
	}
	if resp, body := get("Other.Test.:80", "/b"); resp.StatusCode != http.StatusOK || body != "hello Other.Test.:80/b" {
		t.Errorf("another allowed name on the same connection: %d %q", resp.StatusCode, body)
	}
	// The policy changes: other.test is no longer allowed, and the
	// connection, last used for it, is cut.
	at.pol.Store(compile(policy.Network{Mode: policy.NetFiltered, AllowOut: rules(t, "allowed.test")}))
	p.recheck()
	if _, err := br.ReadByte(); err == nil {
		t.Error("the connection outlived a policy that no longer allows its name")
	}
	<-served

	client, in = tcpPair(t)
	r = &relay{in: in, dst: dst}
	p.track(r)
	served = make(chan struct{})
	go func() {
		defer close(served)
		defer p.wg.Done()
		defer p.untrack(r)
		p.serveHTTP(r, in, false)
	}()
	br = bufio.NewReader(client)
	if resp, body := get("evil.test", "/"); resp.StatusCode != http.StatusForbidden || !resp.Close ||
		body != "refused by the sandbox's network policy: not in allowOut\n" {
		t.Errorf("a name not allowed: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	<-served
	p.close()
}

// TestSetOutAfterClose: a connection dialed while the proxy closed, or
// whose destination the policy stopped allowing meanwhile, is not used.
func TestSetOutAfterClose(t *testing.T) {
	at := lab(t, policy.Network{Mode: policy.NetInternet})
	p := at.proxy
	_, out := tcpPair(t)
	r := &relay{dst: netip.MustParseAddrPort("127.0.0.1:8080")}
	at.pol.Store(compile(policy.Network{Mode: policy.NetFiltered}))
	if p.setOut(r, out) || r.out != nil {
		t.Error("setOut under a policy that no longer allows the destination")
	}
	at.pol.Store(compile(policy.Network{Mode: policy.NetInternet}))
	if !p.setOut(r, out) || r.out != out {
		t.Error("setOut under a policy that allows it")
	}
	r.out = nil
	p.close()
	if p.setOut(r, out) || r.out != nil {
		t.Error("setOut after close")
	}
	if p.track(&relay{}) {
		t.Error("track after close")
	}
}

// TestPipeHalfCloses: what one side sends reaches the other whole, and
// its end arrives as a half-close: the other side can still answer.
func TestPipeHalfCloses(t *testing.T) {
	sandbox, in := tcpPair(t)
	out, far := tcpPair(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipe(out, in, nil)
	}()
	msg := bytes.Repeat([]byte("x"), 100<<10)
	sandbox.Write(msg)
	sandbox.CloseWrite()
	got, err := io.ReadAll(far) // ends at the half-close
	if err != nil || !bytes.Equal(got, msg) {
		t.Errorf("the far side read %d bytes (%v), want %d", len(got), err, len(msg))
	}
	<-done
	// The way back is still open.
	go far.Write([]byte("answer"))
	buf := make([]byte, 6)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "answer" {
		t.Errorf("the answer after the half-close: %q %v", buf, err)
	}
}

// TestPipeClosesOnError: a side that fails (a timeout, a reset) closes
// the other whole, not half: nothing more will come.
func TestPipeClosesOnError(t *testing.T) {
	_, in := tcpPair(t)
	out, far := tcpPair(t)
	in.SetReadDeadline(time.Now()) // the read fails at once
	pipe(out, in, nil)
	if _, err := far.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the far side after the other failed: %v, want the end", err)
	}
	if _, err := out.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("writing to the closed side: %v, want closed", err)
	}
}

// TestLimitedConn: the bandwidth limits pass data whole, in pieces of at
// most 32 KiB, and a half-close through them.
func TestLimitedConn(t *testing.T) {
	client, server := tcpPair(t)
	lc := &limitedConn{Conn: server, read: rate.NewLimiter(rate.Inf, 0), write: rate.NewLimiter(rate.Inf, 0)}
	msg := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB
	go func() {
		lc.Write(msg)
		lc.CloseWrite()
	}()
	got, err := io.ReadAll(client)
	if err != nil || !bytes.Equal(got, msg) {
		t.Errorf("through the limits: %d bytes, %v", len(got), err)
	}
	go client.Write(msg)
	buf := make([]byte, len(msg))
	n, err := lc.Read(buf)
	if err != nil || n > 32<<10 {
		t.Errorf("one read: %d bytes, %v; want at most 32 KiB", n, err)
	}
	r := &relay{in: server}
	p := newProxy(&Attachment{}, nil, Limits{Connections: 1, Bandwidth: 1 << 20})
	if _, ok := p.limited(r).(*limitedConn); !ok {
		t.Error("a proxy with a bandwidth does not limit")
	}
	if p := newProxy(&Attachment{}, nil, Limits{Connections: 1}); func() bool { _, ok := p.limited(r).(*countedConn); return !ok }() {
		t.Error("a proxy without a bandwidth limits")
	}
}
