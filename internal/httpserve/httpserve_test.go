package httpserve

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

func listen(t *testing.T, l Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, errc := Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }), l)
	t.Cleanup(func() {
		srv.Close()
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// get sends one request on c and reads its answer.
func get(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestIdleConnectionsClosed: a keep-alive connection that sends nothing
// more is closed by the server.
func TestIdleConnectionsClosed(t *testing.T) {
	addr := listen(t, Limits{IdleTimeout: 100 * time.Millisecond})
	c := dial(t, addr)
	br := bufio.NewReader(c)
	get(t, c, br)
	// Eventually: the deadline only keeps a broken server from hanging
	// the test.
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("an idle connection: read %v, want EOF (closed by the server)", err)
	}
}

// TestConnectionsBounded: past MaxConns a connection is not served
// until one of the others closes.
func TestConnectionsBounded(t *testing.T) {
	addr := listen(t, Limits{MaxConns: 2})
	held := []net.Conn{dial(t, addr), dial(t, addr)}
	for _, c := range held {
		get(t, c, bufio.NewReader(c)) // accepted, and kept alive
	}
	extra := dial(t, addr) // the kernel completes it; the server does not take it
	fmt.Fprint(extra, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(extra)
	extra.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection with two held: read %v, want no answer yet", err)
	}
	held[0].Close()
	extra.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("once one closed: %v %v, want an answer", resp, err)
	}
}
