// Package forward connects the daemon to a port that a process in the
// sandbox listens on (agentproto.ForwardPath): the agent dials it on the
// sandbox's loopback, answers 101, and from then on copies bytes both
// ways. It works on every backend, with or without a network.
package forward

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Register adds the daemon's private ForwardPath to mux.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("GET "+agentproto.ForwardPath, Forward)
}

// Forward takes the request's connection over as a connection to the
// port ?port= of the sandbox's loopback.
func Forward(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, "a port from 1 to 65535 is needed", http.StatusBadRequest)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), agentproto.ForwardProtocol) {
		http.Error(w, "Upgrade: "+agentproto.ForwardProtocol+" is needed", http.StatusBadRequest)
		return
	}
	target, err := dialLoopback(port)
	if err != nil {
		http.Error(w, agentproto.ForwardRefused, http.StatusBadGateway)
		return
	}
	defer target.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "cannot take the connection over", http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+agentproto.ForwardProtocol+"\r\n\r\n"); err != nil {
		return
	}
	// What the daemon sent after its request, already read into brw.
	if n := brw.Reader.Buffered(); n > 0 {
		buffered, _ := brw.Reader.Peek(n)
		if _, err := target.Write(buffered); err != nil {
			return
		}
	}
	done := make(chan struct{})
	go func() {
		io.Copy(conn, target)
		closeWrite(conn)
		close(done)
	}()
	io.Copy(target, conn)
	closeWrite(target)
	<-done
}

// dialLoopback connects to port on the sandbox's loopback, IPv4 first.
func dialLoopback(port int) (net.Conn, error) {
	var errs []error
	for _, host := range []string{"127.0.0.1", "::1"} {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), 5*time.Second)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
