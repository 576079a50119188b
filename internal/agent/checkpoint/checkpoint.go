// Package checkpoint serves the agent on a unix socket that it lets go
// of for a checkpoint, and listens on again after it.
//
// Checkpoints (gVisor's runsc checkpoint) save the whole sandbox, but not
// a socket bound to or connected through the host: the agent's own, on
// which the daemon reaches it. So before one, the daemon asks the agent
// to let go of all of them (agentproto.CheckpointPath): it answers,
// closes its listener and every connection it accepted (hijacked ones
// included), removes its socket file, and waits. After a restore, or a
// checkpoint that failed, it listens again on the same path: it learns
// that the save is over from gVisor's /proc/gvisor/checkpoint, opened
// before it (a read that waits for the save's end, then says "restore"
// in a restored copy, "resume" or "error" in the sandbox that was saved
// and runs on), or from agentproto.ResumeSignal, which the daemon sends
// when no save began or an agent does not listen again by itself.
// Processes, files and kernels inside are untouched throughout.
package checkpoint

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Server serves at a path, and lets go of it when the daemon asks.
type Server struct {
	log *slog.Logger
	// saveEnd opens what reads once the next save has ended (gVisor's
	// /proc/gvisor/checkpoint); an error: the signal alone resumes.
	saveEnd func() (io.ReadCloser, error)

	mu      sync.Mutex
	quiesce func() // lets go of the daemon's socket; nil: it cannot
}

// New returns a server that logs to log.
func New(log *slog.Logger) *Server {
	return &Server{log: log, saveEnd: func() (io.ReadCloser, error) { return os.Open(gvisorCheckpoint) }}
}

// gvisorCheckpoint is gVisor's file of the checkpoints' ends: a reader
// opened before a save gets, once it is over, "restore" in a copy
// restored from it, "resume" or "error" in the sandbox that was saved.
const gvisorCheckpoint = "/proc/gvisor/checkpoint"

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
		// Opened before the socket goes: the daemon saves only once
		// it has gone, so this reader waits for that save's end.
		saved := s.awaitSaveEnd()
		srv.Close()
		tl.CloseAll()
		os.Remove(path)
		// The daemon may signal an agent that listens again: a signal
		// of an earlier save must not end this wait.
		for len(resume) > 0 {
			<-resume
		}
		s.log.Info("let go of the daemon's socket for a checkpoint")
		select {
		case <-saved.ended:
			s.log.Info("the save is over", "then", saved.result)
		case <-resume:
		case <-ctx.Done():
			saved.stop()
			return nil
		}
		saved.stop()
	}
}

// saveEnd is a wait for the end of a save.
type saveEnd struct {
	f      io.Closer     // nil: no such wait here (not gVisor)
	ended  chan struct{} // closed once f has said how the save ended
	result string
}

// awaitSaveEnd starts waiting for the end of the next save.
func (s *Server) awaitSaveEnd() *saveEnd {
	e := &saveEnd{ended: make(chan struct{})}
	f, err := s.saveEnd()
	if err != nil {
		return e // never ends: the signal resumes
	}
	e.f = f
	go func() {
		b, err := io.ReadAll(io.LimitReader(f, 64))
		switch r := strings.TrimSpace(string(b)); {
		case err != nil:
			// Closed by stop: the signal resumed.
		case r == "restore" || r == "resume" || r == "error":
			e.result = r
			close(e.ended)
		default:
			// Not a save's end: listening now could fail a save about
			// to begin. The signal resumes.
		}
	}()
	return e
}

// stop ends the wait: its reader closed ends its read.
func (e *saveEnd) stop() {
	if e.f != nil {
		e.f.Close()
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
