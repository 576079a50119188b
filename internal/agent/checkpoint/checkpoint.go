// Package checkpoint serves the agent on a unix socket that it lets go
// of for a checkpoint, and listens on again after it.
//
// Checkpoints (gVisor's runsc checkpoint) save the whole sandbox, but not
// a socket bound to or connected through the host: the agent's own, on
// which the daemon reaches it. So before one, the daemon asks the agent
// to let go of all of them (agentproto.CheckpointPath): it answers,
// closes its listener and every connection it accepted (hijacked ones
// included), removes its socket file, and waits. After a restore, or a
// checkpoint that failed, the daemon sends it agentproto.ResumeSignal,
// and it listens again on the same path. Processes, files and kernels
// inside are untouched throughout.
package checkpoint

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Server serves at a path, and lets go of it when the daemon asks.
type Server struct {
	log *slog.Logger

	mu      sync.Mutex
	quiesce func() // lets go of the daemon's socket; nil: it cannot
}

// New returns a server that logs to log.
func New(log *slog.Logger) *Server { return &Server{log: log} }

// Register adds the daemon's private CheckpointPath to mux.
func (s *Server) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST "+agentproto.CheckpointPath, s.checkpoint)
}

// Serve answers h on a unix socket at path, letting go of it whenever
// the daemon asks for a checkpoint and listening again when resume
// (agentproto.ResumeSignal's channel) has a value, until ctx ends.
func (s *Server) Serve(ctx context.Context, path string, h http.Handler, resume <-chan os.Signal) error {
	for {
		ln, err := net.Listen("unix", path)
		if err != nil {
			return err
		}
		s.log.Debug("listening", "path", path)
		tl := NewListener(ln)
		quiesce := make(chan struct{})
		s.setQuiesce(func() { close(quiesce) })
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(tl) }()
		select {
		case <-ctx.Done():
			srv.Close()
			return nil
		case err := <-served:
			return err
		case <-quiesce:
		}
		srv.Close()
		tl.CloseAll()
		os.Remove(path)
		// The daemon signals a restored agent until it listens: a
		// signal of that earlier restore must not end this wait.
		for len(resume) > 0 {
			<-resume
		}
		s.log.Info("let go of the daemon's socket for a checkpoint")
		select {
		case <-resume:
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *Server) setQuiesce(f func()) {
	s.mu.Lock()
	s.quiesce = sync.OnceFunc(f)
	s.mu.Unlock()
}

// checkpoint answers, then lets go of the daemon's socket (Serve).
func (s *Server) checkpoint(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	quiesce := s.quiesce
	s.mu.Unlock()
	if quiesce == nil {
		http.Error(w, "this agent's socket was handed to it: it cannot let go of it", http.StatusNotImplemented)
		return
	}
	w.WriteHeader(http.StatusNoContent)
	http.NewResponseController(w).Flush()
	quiesce()
}

// NewListener tracks the connections ln accepts.
func NewListener(ln net.Listener) *Listener {
	return &Listener{Listener: ln, conns: map[net.Conn]struct{}{}}
}

// Listener remembers the connections it accepted until they are
// closed, so that all of them can be closed at once: http.Server.Close
// forgets hijacked ones (the forwarded ports').
type Listener struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

// CloseAll closes the listener and every connection it accepted.
func (l *Listener) CloseAll() {
	l.Listener.Close()
	l.mu.Lock()
	conns := l.conns
	l.conns = map[net.Conn]struct{}{}
	l.mu.Unlock()
	for c := range conns {
		c.(*trackedConn).Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
