package agentproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ForwardPath is the private endpoint through which the daemon reaches a
// port that a process in the sandbox listens on: the agent connects to it
// on the sandbox's loopback and the HTTP connection becomes that TCP
// connection (an HTTP/1.1 upgrade to ForwardProtocol). It works on every
// backend, with or without a network: the daemon never dials into a
// sandbox's network, it asks the agent.
const ForwardPath = SetupPath + "forward"

// ForwardProtocol is the Upgrade token of ForwardPath.
const ForwardProtocol = "airlock-forward"

// Forward failures the agent reports with 502 Bad Gateway; the first line
// of the body says which.
const (
	ForwardRefused = "nothing listens on this port in the sandbox"
)

// maxForwardHead bounds the agent's answer to a forward request.
const maxForwardHead = 16 << 10

// ErrForwardRefused: no process in the sandbox listens on the port.
var ErrForwardRefused = errors.New(ForwardRefused)

// DialForward turns conn, a fresh connection to the agent, into a
// connection to port inside the sandbox. It returns the connection to
// use: bytes the agent sent right after its answer are not lost.
func DialForward(ctx context.Context, conn net.Conn, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d is out of range", port)
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	} else {
		conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	req := "GET " + ForwardPath + "?port=" + strconv.Itoa(port) + " HTTP/1.1\r\n" +
		"Host: agent\r\nConnection: Upgrade\r\nUpgrade: " + ForwardProtocol + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, err
	}
	// The agent is as untrusted as the sandbox: its answer's head is
	// bounded, then the connection is the sandbox's port's, unbounded.
	lim := &io.LimitedReader{R: conn, N: maxForwardHead}
	br := bufio.NewReader(lim)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode == http.StatusBadGateway && strings.HasPrefix(string(msg), ForwardRefused) {
			return nil, ErrForwardRefused
		}
		return nil, &Error{CodeUnavailable, fmt.Sprintf("forward to port %d: %s", port, resp.Status)}
	}
	if !stop() && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	conn.SetDeadline(time.Time{})
	lim.N = math.MaxInt64
	return &bufferedConn{Conn: conn, r: br}, nil
}

// bufferedConn reads what a bufio.Reader holds before the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection where it can, so that the far
// side sees the end of a request.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
