// Package interpreter serves E2B's code interpreter (its port,
// agentproto.InterpreterPort): contexts, each a Jupyter kernel, and
// executions that stream what the kernel produced as NDJSON lines
// (agentproto.ExecuteLine).
package interpreter

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/environ"
	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// kernelEnv is added to every kernel's environment: figures are sent as
// images (Jupyter's inline backend), not written by the Agg backend the
// sandbox's plain commands get.
var kernelEnv = map[string]string{"MPLBACKEND": "module://matplotlib_inline.backend_inline"}

// Service is one sandbox's code interpreter.
type Service struct {
	log   *slog.Logger
	users identity.Users
	env   *environ.Env

	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]string // language → its default context
	// starting serializes the creation of default contexts: the first
	// cell of a sandbox claimed while its kernel is being prestarted waits
	// for that kernel instead of starting a second one beside it.
	starting sync.Mutex
	// settled is closed once the kernel Prestart starts is ready
	// (warm.go).
	settled chan struct{}
	// late are the languages whose kernels WarmLatePath starts, once.
	late     []string
	lateOnce sync.Once
	// exported are the sandbox's envVars (ExportEnv), and exports counts
	// the calls: a kernel that started before the last one is told them.
	exported map[string]string
	exports  int
	// grace is how long a kernel has to come back after an interrupt
	// (interruptGrace; shorter in tests).
	grace time.Duration
}

// New returns an interpreter whose kernels run as users' user, with env.
func New(log *slog.Logger, users identity.Users, env *environ.Env) *Service {
	settled := make(chan struct{})
	close(settled) // no kernel is prestarted unless Prestart says so
	return &Service{log: log, users: users, env: env, contexts: map[string]*codeContext{}, defaults: map[string]string{}, settled: settled, grace: interruptGrace}
}

// Handler serves the interpreter's port.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("OK")) })
	mux.HandleFunc("POST "+agentproto.ExecutePath, s.execute)
	mux.HandleFunc("POST /contexts", s.createContext)
	mux.HandleFunc("GET /contexts", s.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", s.deleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	return mux
}

// Register adds the daemon's private endpoints of the interpreter (warm
// snapshots' SettlePath and ReseedPath, pools' WarmLatePath) to mux, the
// envd port's.
func (s *Service) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST "+agentproto.SettlePath, s.settle)
	mux.HandleFunc("POST "+agentproto.ReseedPath, s.reseed)
	mux.HandleFunc("POST "+agentproto.WarmLatePath, s.warmLate)
}

func jsonError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": fmt.Sprintf(format, args...)})
}

// newID is a random id for a context.
func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Close kills every kernel the service started (see process.Service's
// Close for who needs it).
func (s *Service) Close() {
	s.mu.Lock()
	contexts := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		contexts = append(contexts, c)
	}
	s.mu.Unlock()
	for _, c := range contexts {
		c.close()
	}
}
