// Package agent is the server inside every sandbox: it runs commands and
// serves files over the envd-compatible protocol the E2B SDKs speak, and
// the code interpreter. This package puts the services together (each is
// a package of its own, as envd's are) and serves them.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/checkpoint"
	"github.com/airlock-sandbox/airlock/internal/agent/environ"
	"github.com/airlock-sandbox/airlock/internal/agent/files"
	"github.com/airlock-sandbox/airlock/internal/agent/filestate"
	"github.com/airlock-sandbox/airlock/internal/agent/filesystem"
	"github.com/airlock-sandbox/airlock/internal/agent/forward"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agent/interpreter"
	"github.com/airlock-sandbox/airlock/internal/agent/process"
	"github.com/airlock-sandbox/airlock/internal/agent/sudo"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Agent serves one sandbox.
type Agent struct {
	log   *slog.Logger
	users identity.Users
	env   *environ.Env

	procs  *process.Service
	fs     *filesystem.Service
	interp *interpreter.Service

	cp *checkpoint.Server
}

// New returns an agent for a sandbox whose user lives in home, which acts
// for that user alone.
func New(log *slog.Logger, home string) *Agent {
	return newAgent(log, identity.Users{Home: home})
}

func newAgent(log *slog.Logger, users identity.Users) *Agent {
	a := &Agent{log: log, users: users, env: environ.New(os.Environ())}
	a.procs = process.New(users, a.env)
	a.fs = filesystem.New(users)
	a.cp = checkpoint.New(log)
	a.interp = interpreter.New(log, users, a.env)
	return a
}

// Handler routes the envd protocol, and the code interpreter for requests
// addressed to its port.
func (a *Agent) Handler() http.Handler {
	envd := a.envdHandler()
	interp := a.interp.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("E2b-Sandbox-Port") == agentproto.InterpreterPort {
			interp.ServeHTTP(w, r)
			return
		}
		envd.ServeHTTP(w, r)
	})
}

// envdHandler serves envd's port: its services, then the daemon's
// private endpoints (agentproto.SetupPath), each registered by the
// service it belongs to.
func (a *Agent) envdHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	a.procs.Register(mux)
	a.fs.Register(mux) // and DiskPath
	files.New(a.users).Register(mux)

	mux.HandleFunc("POST "+agentproto.SetupEnvPath, a.setup)
	a.interp.Register(mux) // SettlePath, ReseedPath, WarmLatePath
	a.cp.Register(mux)
	filestate.New(a.log, a.users.Root).Register(mux)
	forward.Register(mux)
	return mux
}

// setup takes the sandbox's envs when the daemon hands it out: every
// process started from now on gets them, and every kernel running now.
func (a *Agent) setup(w http.ResponseWriter, r *http.Request) {
	var s agentproto.Setup
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&s); err != nil {
		http.Error(w, "bad setup: "+err.Error(), http.StatusBadRequest)
		return
	}
	a.env.Set(s.EnvVars)
	if len(s.EnvVars) > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
		a.interp.ExportEnv(ctx, s.EnvVars)
		cancel()
	}
	w.WriteHeader(http.StatusNoContent)
}

// Close ends every process and kernel the agent started. A sandbox's end
// does that for an agent inside it; an agent in a process that outlives
// its sandbox (the fake backend's, in tests) is closed instead.
func (a *Agent) Close() {
	a.procs.Close()
	a.interp.Close()
}

// Serve answers on ln until ctx ends.
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Main runs the agent as a sandbox's command: the daemon passes it a
// listening socket as file descriptor 3.
func Main() error {
	// Not dumpable: the agent runs as the same uid as the code it runs,
	// which must not read or write its memory through /proc.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return err
	}
	// The daemon hands over a listening socket as fd 3; where it cannot
	// (gVisor), it names a path to listen on.
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/home/user"
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Started as the sandbox's root (a template made from an image), it
	// acts for "root" and, as the kernel sees them, for "user".
	a := newAgent(log, identity.Users{Home: home, Root: os.Geteuid() == 0})
	if a.users.Root {
		if err := sudo.Serve(log, a.users); err != nil {
			return err
		}
	}
	// A template that serves code starts its kernel now, in the pool.
	if lang := os.Getenv(agentproto.PrestartEnv); lang != "" {
		a.interp.Prestart(lang)
	}
	if late := os.Getenv(agentproto.PrestartLateEnv); late != "" {
		a.interp.PrestartLate(strings.Split(late, ","))
	}
	if path := os.Getenv(agentproto.SocketEnv); path != "" {
		resume := make(chan os.Signal, 1)
		signal.Notify(resume, agentproto.ResumeSignal)
		return a.cp.Serve(context.Background(), path, a.Handler(), resume)
	}
	f := os.NewFile(3, "listener")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return err
	}
	return a.Serve(context.Background(), ln)
}
