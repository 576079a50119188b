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
// its choosing gets a connection that fails, never the secret. For plain
// HTTP, where nothing can be verified, a secret goes only to an address
// the sandbox's resolver gave for the name.
//
// The secret never enters the sandbox: it is filled in here, and masked
// ('*' for each byte) wherever the server's answer repeats it, in the
// headers and the body (which is asked for without compression so that
// it can be read).

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
	c, err := p.dialer.DialContext(ctx, "tcp4", r.dst.String())
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

// transform applies the rules for name to req, and returns the secrets'
// values it filled in, to be masked in the answer.
func (p *proxy) transform(req *http.Request, ts []policy.Transform) ([][]byte, error) {
	var filled [][]byte
	secret := func(name string) (string, error) {
		if p.a.host.secrets == nil {
			return "", errSecret
		}
		v, err := p.a.host.secrets(name)
		if err != nil || v == "" {
			p.a.logger().Warn("a secret of the sandbox's rules cannot be read", "secret", name, "err", err)
			return "", errSecret
		}
		filled = append(filled, []byte(v))
		return v, nil
	}
	for _, t := range ts {
		for name, value := range t.Headers {
			v, err := policy.Fill(value, secret)
			if err != nil {
				return nil, err
			}
			req.Header.Set(name, v)
		}
	}
	if len(filled) > 0 {
		req.Header.Del("Accept-Encoding") // an answer to read for the secret
	}
	return filled, nil
}

// masked are the secrets of a request, for its answer: a context value.
type maskedKey struct{}

// maskResponse masks the secrets of resp's request in its headers and
// body.
func maskResponse(resp *http.Response) error {
	secrets, _ := resp.Request.Context().Value(maskedKey{}).([][]byte)
	if len(secrets) == 0 {
		return nil
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			b := []byte(v)
			mask(b, secrets)
			resp.Header[k][i] = string(b)
		}
	}
	resp.Body = newMasker(resp.Body, secrets)
	return nil
}

// mask overwrites every occurrence of a secret in b with '*'s.
func mask(b []byte, secrets [][]byte) {
	for _, s := range secrets {
		for i := 0; ; {
			j := bytes.Index(b[i:], s)
			if j < 0 {
				break
			}
			for k := range s {
				b[i+j+k] = '*'
			}
			i += j + len(s)
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
