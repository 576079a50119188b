package netpolicy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// The most a connection may send before its name is known, and how long
// it may take: a client of HTTP or TLS speaks first, at once.
const (
	maxSniff     = 64 << 10
	sniffTimeout = 10 * time.Second
)

// sniffName reads the start of a connection to port 80 (an HTTP request's
// Host) or 443 (a TLS ClientHello's server name) and returns the name it
// is meant for, lower case, "" when it names none, with every byte read:
// they are sent on first, as they came. Only Go's own parsers read what
// the sandbox sent.
func sniffName(c net.Conn, port uint16) (name string, head []byte, err error) {
	var buf bytes.Buffer
	r := io.TeeReader(io.LimitReader(c, maxSniff), &buf)
	c.SetReadDeadline(time.Now().Add(sniffTimeout))
	defer c.SetReadDeadline(time.Time{})
	switch port {
	case httpPort:
		req, rerr := http.ReadRequest(bufio.NewReaderSize(r, 4096))
		if rerr != nil {
			return "", buf.Bytes(), nil // not HTTP: judged by address
		}
		name = req.Host
		if h, _, err := net.SplitHostPort(name); err == nil {
			name = h
		}
	case httpsPort:
		name, err = clientHelloName(r)
		if err != nil {
			return "", buf.Bytes(), nil // not TLS: judged by address
		}
	}
	return strings.ToLower(strings.TrimSuffix(name, ".")), buf.Bytes(), nil
}

// errHello stops a TLS handshake once the ClientHello has been read.
var errHello = errors.New("client hello read")

// clientHelloName parses a TLS ClientHello with crypto/tls and returns its
// server name, answering nothing: the handshake stops at the hello.
func clientHelloName(r io.Reader) (string, error) {
	var name string
	conn := tls.Server(readOnlyConn{r}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name = h.ServerName
			return nil, errHello
		},
	})
	err := conn.Handshake()
	if !errors.Is(err, errHello) {
		return "", err
	}
	return name, nil
}

// readOnlyConn is a net.Conn that reads from r and swallows writes (the
// alert a stopped handshake sends).
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c readOnlyConn) Close() error                     { return nil }
func (c readOnlyConn) LocalAddr() net.Addr              { return nil }
func (c readOnlyConn) RemoteAddr() net.Addr             { return nil }
func (c readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (c readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (c readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
