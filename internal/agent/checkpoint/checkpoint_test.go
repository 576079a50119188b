package checkpoint

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// events is a slog handler that passes each record's message to a
// channel: what the server does, as it happens, for tests to wait on.
type events struct {
	ch chan string
}

func (e *events) Enabled(context.Context, slog.Level) bool      { return true }
func (e *events) Handle(_ context.Context, r slog.Record) error { e.ch <- r.Message; return nil }
func (e *events) WithAttrs([]slog.Attr) slog.Handler            { return e }
func (e *events) WithGroup(string) slog.Handler                 { return e }

// await reads ev until msg comes.
func (e *events) await(t *testing.T, msg string) {
	t.Helper()
	for m := range e.ch {
		if m == msg {
			return
		}
	}
}

// served is a server serving at a socket path, with a mux that answers
// /health, holds /hold's connections (hijacked, as a forwarded port's),
// and registers the checkpoint.
type served struct {
	path   string
	resume chan os.Signal
	ev     *events
	done   chan error
	client *agentproto.Client
}

func serve(t *testing.T, ctx context.Context) *served {
	t.Helper()
	return serveSaves(t, ctx, nil)
}

// serveSaves is serve with saveEnd in the place of gVisor's file (nil:
// none, as on a host).
func serveSaves(t *testing.T, ctx context.Context, saveEnd func() (io.ReadCloser, error)) *served {
	t.Helper()
	s := &served{path: filepath.Join(t.TempDir(), "agent.sock"), resume: make(chan os.Signal, 1), ev: &events{ch: make(chan string, 16)}, done: make(chan error, 1)}
	srv := New(slog.New(s.ev))
	if saveEnd == nil {
		saveEnd = func() (io.ReadCloser, error) { return nil, os.ErrNotExist }
	}
	srv.saveEnd = saveEnd
	mux := http.NewServeMux()
	srv.Register(mux)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /hold", func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		io.WriteString(c, "held\n")
		io.Copy(io.Discard, c) // until it is closed
	})
	go func() { s.done <- srv.Serve(ctx, s.path, mux, s.resume) }()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", s.path)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	s.client = &agentproto.Client{Transport: tr}
	s.ev.await(t, "listening")
	return s
}

// hold opens a connection that the server hijacks and holds.
func (s *served) hold(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", s.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: agent\r\n\r\n")
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("hold: %q, %v", line, err)
	}
	return c
}

// healthy asks the agent for its health.
func (s *served) healthy(t *testing.T) error {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://agent/health", nil)
	resp, err := s.client.Transport.RoundTrip(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// TestCheckpoint: the agent answers, then lets go of its socket and of
// every connection to it, hijacked ones too, removes its socket file,
// and listens again only when resumed, on the same path.
func TestCheckpoint(t *testing.T) {
	s := serve(t, t.Context())
	held := s.hold(t)
	if err := s.healthy(t); err != nil {
		t.Fatal(err)
	}
	if err := s.client.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, err := held.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the held connection: read %d, %v; want it closed", n, err)
	}
	s.ev.await(t, "let go of the daemon's socket for a checkpoint")
	if _, err := os.Stat(s.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket file while let go of: %v", err)
	}
	s.client.Transport.(*http.Transport).CloseIdleConnections()
	if err := s.healthy(t); err == nil {
		t.Error("the agent answered while let go of its socket")
	}
	s.resume <- syscall.SIGUSR1
	s.ev.await(t, "listening")
	if err := s.healthy(t); err != nil {
		t.Errorf("after resume: %v", err)
	}
	// And again: every checkpoint of the sandbox's life.
	if err := s.client.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.ev.await(t, "let go of the daemon's socket for a checkpoint")
}

// TestSaveEnd: an agent that let go listens again once a save is over,
// as gVisor's file says, without the signal; anything else that file
// says leaves it waiting for the signal, and a signal stops its wait.
func TestSaveEnd(t *testing.T) {
	ends := make(chan *io.PipeWriter, 1)
	s := serveSaves(t, t.Context(), func() (io.ReadCloser, error) {
		r, w := io.Pipe()
		ends <- w
		return r, nil
	})
	letGo := func() *io.PipeWriter {
		t.Helper()
		if err := s.client.Checkpoint(t.Context()); err != nil {
			t.Fatal(err)
		}
		s.ev.await(t, "let go of the daemon's socket for a checkpoint")
		return <-ends
	}
	for _, end := range []string{"restore\n", "resume\n", "error\n"} {
		w := letGo()
		io.WriteString(w, end)
		w.Close()
		s.ev.await(t, "listening")
		if err := s.healthy(t); err != nil {
			t.Errorf("after %q: %v", end, err)
		}
	}
	// Not a save's end: the signal resumes.
	w := letGo()
	io.WriteString(w, "what\n")
	w.Close()
	s.resume <- syscall.SIGUSR1
	s.ev.await(t, "listening")
	// Resumed by the signal: the wait's reader is closed.
	w = letGo()
	s.resume <- syscall.SIGUSR1
	s.ev.await(t, "listening")
	if _, err := io.WriteString(w, "restore\n"); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("the reader of a wait the signal ended: %v, want it closed", err)
	}
}

// TestStaleResume: a resume signal left over from an earlier restore
// does not end the wait of this checkpoint.
func TestStaleResume(t *testing.T) {
	s := serve(t, t.Context())
	s.resume <- syscall.SIGUSR1 // as the daemon signals a restored agent until it listens
	if err := s.client.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.ev.await(t, "let go of the daemon's socket for a checkpoint")
	if len(s.resume) != 0 {
		t.Fatal("the stale signal is still there")
	}
	if _, err := os.Stat(s.path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent listens again after a stale signal: %v", err)
	}
	s.resume <- syscall.SIGUSR1
	s.ev.await(t, "listening")
}

// TestServeEnds: the server returns when its context ends, listening or
// let go of its socket.
func TestServeEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	s := serve(t, ctx)
	cancel()
	if err := <-s.done; err != nil {
		t.Errorf("listening: %v", err)
	}
	ctx, cancel = context.WithCancel(t.Context())
	s = serve(t, ctx)
	s.client.Checkpoint(t.Context())
	s.ev.await(t, "let go of the daemon's socket for a checkpoint")
	cancel()
	if err := <-s.done; err != nil {
		t.Errorf("let go: %v", err)
	}
}

func TestServeFails(t *testing.T) {
	err := New(slog.New(slog.DiscardHandler)).Serve(t.Context(), filepath.Join(t.TempDir(), "no", "dir", "sock"), http.NotFoundHandler(), nil)
	if err == nil {
		t.Error("listening where no directory is succeeded")
	}
}

// TestCheckpointHandedOver: an agent served on a socket it was handed
// cannot let go of it, and says so.
func TestCheckpointHandedOver(t *testing.T) {
	w := httptest.NewRecorder()
	New(slog.New(slog.DiscardHandler)).checkpoint(w, httptest.NewRequest("POST", agentproto.CheckpointPath, nil))
	if w.Code != http.StatusNotImplemented {
		t.Errorf("got %d, want 501", w.Code)
	}
}

// TestTrackedConns: a connection closed by its owner is forgotten; the
// rest are closed together, each once.
func TestTrackedConns(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	tl := NewListener(ln)
	var accepted []net.Conn
	for range 3 {
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		a, err := tl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		accepted = append(accepted, a)
	}
	if err := accepted[0].Close(); err != nil {
		t.Fatal(err)
	}
	if len(tl.conns) != 2 {
		t.Errorf("%d tracked after one closed, want 2", len(tl.conns))
	}
	tl.CloseAll()
	for _, a := range accepted {
		if err := a.Close(); err != nil {
			t.Errorf("closing again: %v", err)
		}
	}
	if _, err := tl.Accept(); err == nil {
		t.Error("the listener accepts after closeAll")
	}
}
