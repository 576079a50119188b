// Package httpserve is how Airlock's daemons serve HTTP to clients: a
// client that is slow to send headers or idles between requests is cut
// off, and a listener holds a bounded number of connections.
package httpserve

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Defaults of Limits.
const (
	DefaultMaxConns    = 4096
	DefaultIdleTimeout = 2 * time.Minute
	// ReadHeaderTimeout bounds how long a client may take to send a
	// request's headers, the first request's included.
	ReadHeaderTimeout = 30 * time.Second
)

// Limits bound what clients can hold of a server.
type Limits struct {
	// MaxConns is how many connections the listener holds at once;
	// further ones wait in the kernel's backlog until one closes (0:
	// DefaultMaxConns). Each costs a descriptor and a goroutine, and an
	// idle one costs a client nothing.
	MaxConns int
	// IdleTimeout closes a keep-alive connection that sent no new
	// request for this long (0: DefaultIdleTimeout).
	IdleTimeout time.Duration
	// TLS, when set, serves HTTPS: the handshake is bounded by
	// ReadHeaderTimeout, as the headers are.
	TLS *tls.Config
}

// Serve serves h on ln under l until the server is shut down.
//
// There is no ReadTimeout or WriteTimeout: a request's body and answer
// are a command's input and output streams, which last as long as the
// command, and a file upload as long as the file takes. What a client
// can hold that way is bounded by MaxConns.
func Serve(ln net.Listener, h http.Handler, l Limits) (*http.Server, <-chan error) {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, IdleTimeout: l.IdleTimeout}
	errc := make(chan error, 1)
	ln = netutil.LimitListener(ln, l.MaxConns)
	if l.TLS != nil {
		// Outermost, so that the server sees *tls.Conn: requests carry
		// r.TLS, and the handshake has the header's deadline.
		ln = tls.NewListener(ln, l.TLS)
	}
	go func() { errc <- srv.Serve(ln) }()
	return srv, errc
}
