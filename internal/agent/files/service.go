// Package files serves envd's /files: a sandbox's files downloaded and
// uploaded as the request's user, streamed, never held in memory.
package files

import (
	"encoding/json"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Service serves one sandbox's files.
type Service struct {
	users identity.Users
}

// New returns a service that acts for users.
func New(users identity.Users) *Service { return &Service{users: users} }

// Register adds GET and POST agentproto.FilesPath to mux.
func (s *Service) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET "+agentproto.FilesPath, s.Download)
	mux.HandleFunc("POST "+agentproto.FilesPath, s.Upload)
}

// httpError writes envd's JSON error body with the status the SDK maps
// (400 invalid, 401 auth, 404 not found, 507 no space).
func httpError(w http.ResponseWriter, e *agentproto.Error) {
	status := map[agentproto.Code]int{
		agentproto.CodeInvalidArgument: 400, agentproto.CodeNotFound: 404, agentproto.CodePermissionDenied: 403,
		agentproto.CodeResourceExhausted: 507, agentproto.CodeAlreadyExists: 409, agentproto.CodeFailedPrecondition: 400,
		agentproto.CodeUnauthenticated: 401,
	}[e.Code]
	if status == 0 {
		status = 500
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": e.Message})
}
