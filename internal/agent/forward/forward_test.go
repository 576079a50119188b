package forward

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// serve serves the forward endpoint in-process and returns its address.
func serve(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// upper listens on host's loopback for one connection, answers what it
// reads in upper case, and "bye" once the other side has finished
// writing; it returns the port.
func upper(t *testing.T, network, host string) int {
	t.Helper()
	ln, err := net.Listen(network, net.JoinHostPort(host, "0"))
	if err != nil {
		t.Skipf("no %s loopback here: %v", network, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		data, _ := io.ReadAll(c) // to the client's half-close
		c.Write(append(bytes.ToUpper(data), "bye"...))
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// through forwards a new connection to the agent to port, sends msg,
// half-closes, and returns all the port's process answered.
func through(t *testing.T, agent string, port int, msg string) (string, error) {
	t.Helper()
	conn, err := net.Dial("tcp", agent)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fc, err := agentproto.DialForward(t.Context(), conn, port)
	if err != nil {
		return "", err
	}
	io.WriteString(fc, msg)
	fc.(interface{ CloseWrite() error }).CloseWrite()
	data, err := io.ReadAll(fc)
	return string(data), err
}

// TestForward: bytes both ways, and each side's end of writing passed
// on to the other.
func TestForward(t *testing.T) {
	agent := serve(t)
	for _, tc := range []struct{ network, host string }{{"tcp4", "127.0.0.1"}, {"tcp6", "::1"}} {
		t.Run(tc.network, func(t *testing.T) {
			got, err := through(t, agent, upper(t, tc.network, tc.host), "hello")
			if err != nil || got != "HELLObye" {
				t.Errorf("got %q, %v; want HELLObye", got, err)
			}
		})
	}
}

// TestForwardEarlyBytes: what the daemon sent with its request, before
// the answer, reaches the port first.
func TestForwardEarlyBytes(t *testing.T) {
	agent := serve(t)
	port := upper(t, "tcp4", "127.0.0.1")
	conn, err := net.Dial("tcp", agent)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET "+agentproto.ForwardPath+"?port="+strconv.Itoa(port)+" HTTP/1.1\r\nHost: agent\r\n"+
		"Connection: Upgrade\r\nUpgrade: "+agentproto.ForwardProtocol+"\r\n\r\nearly ")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("got %v, %v", resp, err)
	}
	io.WriteString(conn, "late")
	conn.(*net.TCPConn).CloseWrite()
	if rest, _ := io.ReadAll(br); string(rest) != "EARLY LATEbye" {
		t.Errorf("got %q", rest)
	}
}

func TestForwardRefused(t *testing.T) {
	agent := serve(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	if _, err := through(t, agent, port, "x"); !errors.Is(err, agentproto.ErrForwardRefused) {
		t.Errorf("got %v, want ErrForwardRefused", err)
	}
}

func TestForwardBadRequests(t *testing.T) {
	agent := "http://" + serve(t) + agentproto.ForwardPath
	for _, tc := range []struct {
		query, upgrade, want string
	}{
		{"port=0", agentproto.ForwardProtocol, "a port from 1 to 65535 is needed"},
		{"port=65536", agentproto.ForwardProtocol, "a port from 1 to 65535 is needed"},
		{"port=x", agentproto.ForwardProtocol, "a port from 1 to 65535 is needed"},
		{"", agentproto.ForwardProtocol, "a port from 1 to 65535 is needed"},
		{"port=80", "", "Upgrade: airlock-forward is needed"},
		{"port=80", "websocket", "Upgrade: airlock-forward is needed"},
	} {
		req, _ := http.NewRequest("GET", agent+"?"+tc.query, nil)
		if tc.upgrade != "" {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", tc.upgrade)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || strings.TrimSpace(string(body)) != tc.want {
			t.Errorf("%q %q: %d %q, want 400 %q", tc.query, tc.upgrade, resp.StatusCode, body, tc.want)
		}
	}
}
