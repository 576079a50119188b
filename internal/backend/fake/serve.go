package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/checkpoint"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// The fake serves the agent's handler itself, on a socket it owns, and
// answers three of the agent's private endpoints in the agent's stead:
//
//   - checkpoint: the agent's own lets go of a socket it listens on
//     itself only when it runs as a sandbox's command (agent.Main); the
//     fake does what it does there, and listens again when its backend
//     tells it to (after a checkpoint that failed, a restore, a snapshot);
//   - files, both ways: the agent's own reads and writes /home/user and
//     /tmp, which in the test's process are the host's; the fake's are
//     the box's own (files.go);
//   - setup, which it passes on to the agent after noting the
//     environment (Instance.Env).

// serve starts serving bx's agent as a new instance under p.
func (b *Backend) serve(bx *box, p policy.Policy, netns *os.File) (*Instance, error) {
	ln, err := net.Listen("unix", bx.sock)
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	b.mu.Lock()
	memory, keep := b.memory, b.keepAlive
	b.mu.Unlock()
	i := &Instance{
		box: bx, b: b, policy: p, netns: netns, stop: stop, keep: keep,
		done:     make(chan struct{}),
		removed:  make(chan struct{}),
		usage:    backend.Usage{Memory: memory},
		quiesce:  make(chan struct{}, 1),
		relisten: make(chan chan struct{}),
		released: make(chan struct{}),
	}
	go i.serve(ctx, ln)
	b.mu.Lock()
	b.instances = append(b.instances, i)
	b.mu.Unlock()
	return i, nil
}

// serve answers on ln until ctx ends, letting go of the socket whenever
// the agent is asked for a checkpoint, and listening on it again when
// told to (listenAgain).
func (i *Instance) serve(ctx context.Context, ln net.Listener) {
	defer close(i.done)
	for {
		tl := checkpoint.NewListener(ln)
		srv := &http.Server{Handler: i.handler(), ReadHeaderTimeout: 30 * time.Second}
		served := make(chan struct{})
		go func() { defer close(served); srv.Serve(tl) }()
		select {
		case <-ctx.Done():
		case <-i.quiesce:
		}
		srv.Close()
		tl.CloseAll()
		<-served
		os.Remove(i.sock)
		if ctx.Err() != nil {
			return
		}
		i.mu.Lock()
		close(i.released)
		i.mu.Unlock()
		var ack chan struct{}
		select {
		case <-ctx.Done():
			return
		case ack = <-i.relisten:
		}
		var err error
		ln, err = net.Listen("unix", i.sock)
		i.mu.Lock()
		i.asked, i.released = false, make(chan struct{})
		i.mu.Unlock()
		close(ack)
		if err != nil {
			i.b.log.Error("fake agent: listen again", "err", err)
			return
		}
	}
}

// handler is the agent's, with the endpoints the fake answers itself.
func (i *Instance) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+agentproto.SetupPath+"checkpoint", i.checkpoint)
	files := i.files()
	mux.Handle("GET "+agentproto.SavedFilesPath, files)
	mux.Handle("POST "+agentproto.SavedFilesPath, files)
	mux.HandleFunc("POST "+agentproto.SetupPath+"setup", i.setup)
	mux.Handle("/", i.agentHandler)
	return mux
}

// checkpoint answers, then lets go of the socket, as the agent does.
func (i *Instance) checkpoint(w http.ResponseWriter, r *http.Request) {
	i.mu.Lock()
	i.asked = true
	i.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	http.NewResponseController(w).Flush()
	select {
	case i.quiesce <- struct{}{}:
	default:
	}
}

// setup notes the environment, then hands the request to the agent.
func (i *Instance) setup(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var s agentproto.Setup
	if json.Unmarshal(body, &s) == nil {
		i.envMu.Lock()
		maps.Copy(i.env, s.EnvVars)
		i.envMu.Unlock()
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	i.agentHandler.ServeHTTP(w, r)
}

// awaitRelease waits until the agent, asked to, has let go of its
// socket. An agent that was not asked still holds it, which a real
// runtime could not save: that is an error at once.
func (i *Instance) awaitRelease(ctx context.Context) error {
	i.mu.Lock()
	asked, released := i.asked, i.released
	i.mu.Unlock()
	if !asked {
		return errors.New("the agent still holds its socket: it was not asked to let go of it")
	}
	select {
	case <-released:
		return nil
	case <-i.done:
		return ErrEnded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// listenAgain tells an agent asked to let go of its socket to listen on
// it again, as a backend signals the agent after a checkpoint that
// failed or a snapshot, and returns once it listens (or has ended): a
// test then dials it at once.
func (i *Instance) listenAgain() {
	i.listenMu.Lock()
	defer i.listenMu.Unlock()
	i.mu.Lock()
	asked := i.asked
	i.mu.Unlock()
	if !asked {
		return
	}
	ack := make(chan struct{})
	select {
	case i.relisten <- ack:
	case <-i.done:
		return
	}
	select {
	case <-ack:
	case <-i.done:
	}
}
