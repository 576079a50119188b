package netpolicy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Requests to a host with rules (policy.Network.Rules, E2B's
// network.rules) are changed on their way out: the rules' headers set,
// their secrets filled in. For HTTPS the proxy terminates the sandbox's
// TLS with a certificate of the host's egress CA (ca.go), which the
// sandbox trusts, and opens its own TLS to the server, verified against
// the host's roots: a sandbox that sends a rule's name to an address of
// its choosing gets a connection that fails, never the secret. Plain
// HTTP gets a rule's headers but never a secret: nothing there could be
// verified, and the secret would cross the network in clear.
//
// The secret is filled in here, as the request leaves (after the proxy
// has removed the hop-by-hop headers the sandbox named: it cannot strip
// a rule's header). What the server answers is masked ('*' for each
// byte) wherever it repeats a secret whole: headers, 1xx headers,
// trailers and the body, asked for whole (no Range) and uncompressed; a
// partial or encoded answer is refused (502). That is a safeguard, not
// the boundary: a server that sends the secret back transformed is not
// caught. The boundary is that the secret goes only to the rule's host.

// intercept serves a TLS connection to r.name, a host with rules, whose
// first bytes (the ClientHello) were read as head.
func (p *proxy) intercept(r *relay, head []byte) {
	ca := p.a.host.ca
	if ca == nil {
		p.refuse(r, "request rules need the host's egress CA")
		return
	}
	tc := tls.Server(&replayConn{Conn: p.limited(r), head: head}, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.leaf(r.name) },
		NextProtos:     []string{"http/1.1"},
		MinVersion:     tls.VersionTLS12,
	})
	tc.SetDeadline(time.Now().Add(sniffTimeout))
	if err := tc.HandshakeContext(p.ctx); err != nil {
		p.a.logger().Info("intercepted TLS failed", "dst", r.dst, "name", r.name, "err", err)
		reset(r.in)
		p.audit(r, "allowed", "the sandbox's TLS with the proxy failed (does it trust the host's egress CA?)")
		return
	}
	tc.SetDeadline(time.Time{})
	p.serveHTTP(r, tc, true)
}

// upstreamTLS dials the server r was meant for, by address, and
// verifies that it is r.name.
func (p *proxy) upstreamTLS(ctx context.Context, r *relay) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	c, err := p.dial(ctx, r.dst)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, &tls.Config{ServerName: r.name, RootCAs: p.a.host.roots, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// errSecret: a rule names a secret that cannot be read.
var errSecret = errors.New("a secret the sandbox's rules name cannot be read")

// applied are the rules' headers for a request, with their secrets
// filled in, and the secrets' values, to be masked in its answer: a
// context value, set on the way in and read by the proxy's Rewrite and
// ModifyResponse.
type applied struct {
	headers map[string]string
	secrets [][]byte
}

type appliedKey struct{}

// fill resolves the rules ts: their headers, each secret placeholder
// filled in.
func (p *proxy) fill(ts []policy.Transform) (*applied, error) {
	ap := &applied{headers: map[string]string{}}
	secret := func(name string) (string, error) {
		if p.a.host.secrets == nil {
			return "", errSecret
		}
		v, err := p.a.host.secrets(name)
		if err != nil || v == "" {
			p.a.logger().Warn("a secret of the sandbox's rules cannot be read", "secret", name, "err", err)
			return "", errSecret
		}
		ap.secrets = append(ap.secrets, []byte(v))
		return v, nil
	}
	for _, t := range ts {
		for name, value := range t.Headers {
			v, err := policy.Fill(value, secret)
			if err != nil {
				return nil, err
			}
			ap.headers[name] = v
		}
	}
	return ap, nil
}

// apply sets ap's headers on out, the request as it leaves; with a
// secret among them, the answer is asked for whole and uncompressed, for
// maskResponse to read.
func (ap *applied) apply(out *http.Request) {
	for name, v := range ap.headers {
		out.Header.Set(name, v)
	}
	if len(ap.secrets) > 0 {
		out.Header.Del("Accept-Encoding")
		out.Header.Del("Range")
		out.Header.Del("If-Range")
	}
}

// errPartial: an answer that cannot be searched for the secrets.
var errPartial = errors.New("an answer to a request with a secret came partial or encoded")

// maskResponse masks the secrets of resp's request in its headers and
// body; one it cannot read whole is refused.
func maskResponse(resp *http.Response) error {
	ap, _ := resp.Request.Context().Value(appliedKey{}).(*applied)
	if ap == nil || len(ap.secrets) == 0 {
		return nil
	}
	if enc := resp.Header.Get("Content-Encoding"); resp.StatusCode == http.StatusPartialContent || enc != "" && enc != "identity" {
		resp.Body.Close()
		return errPartial
	}
	maskHeader(resp.Header, ap.secrets)
	resp.Body = newMasker(resp.Body, ap.secrets)
	return nil
}

// maskHeader masks every secret in h's values.
func maskHeader(h http.Header, secrets [][]byte) {
	for _, vs := range h {
		for i, v := range vs {
			b := []byte(v)
			mask(b, secrets)
			vs[i] = string(b)
		}
	}
}

// mask overwrites every occurrence of a secret in b with '*'s: all are
// found in b as it was, then masked, so that two secrets that overlap
// are both masked whole.
func mask(b []byte, secrets [][]byte) {
	type span struct{ from, to int }
	var spans []span
	for _, s := range secrets {
		for i := 0; len(s) > 0; {
			j := bytes.Index(b[i:], s)
			if j < 0 {
				break
			}
			spans = append(spans, span{i + j, i + j + len(s)})
			i += j + 1
		}
	}
	for _, sp := range spans {
		for k := sp.from; k < sp.to; k++ {
			b[k] = '*'
		}
	}
}

// masker reads a body with every secret masked, holding back as many
// bytes as a secret spans, less one, until it knows they start none.
type masker struct {
	src     io.ReadCloser
	secrets [][]byte
	keep    int
	buf     []byte // read and masked, not yet given out
	chunk   []byte
	err     error
}

func newMasker(src io.ReadCloser, secrets [][]byte) *masker {
	m := &masker{src: src, secrets: secrets, chunk: make([]byte, 32<<10)}
	for _, s := range secrets {
		m.keep = max(m.keep, len(s)-1)
	}
	return m
}

func (m *masker) Read(p []byte) (int, error) {
	for {
		ready := len(m.buf) - m.keep
		if m.err != nil {
			ready = len(m.buf)
		}
		if ready > 0 {
			n := copy(p, m.buf[:ready])
			m.buf = append(m.buf[:0], m.buf[n:]...)
			return n, nil
		}
		if m.err != nil {
			return 0, m.err
		}
		n, err := m.src.Read(m.chunk)
		// What is held back was searched already, but a secret may start
		// in it and end in what came.
		from := max(0, len(m.buf)-m.keep)
		m.buf = append(m.buf, m.chunk[:n]...)
		m.err = err
		mask(m.buf[from:], m.secrets)
	}
}

func (m *masker) Close() error { return m.src.Close() }

// replayConn reads head before the connection's own bytes.
type replayConn struct {
	net.Conn
	head []byte
}

func (c *replayConn) Read(b []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(b, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
