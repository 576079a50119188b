package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Checkpoints (gVisor's runsc checkpoint) save the whole sandbox, but not
// a socket bound to or connected through the host: the agent's own, on
// which the daemon reaches it. So before one, the daemon asks the agent to
// let go of all of them (agentproto.CheckpointPath): it answers, closes its
// listener and every connection it accepted (hijacked ones included),
// removes its socket file, and waits. After a restore, or a checkpoint
// that failed, the daemon sends it agentproto.ResumeSignal, and it
// listens again on the same path. Processes, files and kernels inside are
// untouched throughout.

// serveAt answers on a unix socket at path, letting go of it whenever the
// daemon asks for a checkpoint, until ctx ends.
func (a *Agent) serveAt(ctx context.Context, path string) error {
	resume := make(chan os.Signal, 1)
	signal.Notify(resume, agentproto.ResumeSignal)
	for {
		ln, err := net.Listen("unix", path)
		if err != nil {
			return err
		}
		tl := &trackingListener{Listener: ln, conns: map[net.Conn]struct{}{}}
		quiesce := make(chan struct{})
		a.setQuiesce(func() { close(quiesce) })
		srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 30 * time.Second}
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
		tl.closeAll()
		os.Remove(path)
		// The daemon signals a restored agent until it listens: a
		// signal of that earlier restore must not end this wait.
		for len(resume) > 0 {
			<-resume
		}
		a.log.Info("let go of the daemon's socket for a checkpoint")
		select {
		case <-resume:
		case <-ctx.Done():
			return nil
		}
	}
}

func (a *Agent) setQuiesce(f func()) {
	a.quiesceMu.Lock()
	a.quiesce = sync.OnceFunc(f)
	a.quiesceMu.Unlock()
}

// checkpoint answers, then lets go of the daemon's socket (serveAt).
func (a *Agent) checkpoint(w http.ResponseWriter, r *http.Request) {
	a.quiesceMu.Lock()
	quiesce := a.quiesce
	a.quiesceMu.Unlock()
	if quiesce == nil {
		http.Error(w, "this agent's socket was handed to it: it cannot let go of it", http.StatusNotImplemented)
		return
	}
	w.WriteHeader(http.StatusNoContent)
	http.NewResponseController(w).Flush()
	quiesce()
}

// trackingListener remembers the connections it accepted until they are
// closed, so that all of them can be closed at once: http.Server.Close
// forgets hijacked ones (the forwarded ports').
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (l *trackingListener) Accept() (net.Conn, error) {
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

func (l *trackingListener) closeAll() {
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
	l    *trackingListener
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
