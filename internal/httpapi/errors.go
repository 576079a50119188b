package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Errors become statuses here and nowhere else: handlers answer the
// manager's errors with managerError and their own refusals with
// writeError; statusOf is the table between them.

// writeError writes E2B's error body, {code, message}.
func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(errorBody{Code: status, Message: fmt.Sprintf(format, args...)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// managerError maps the manager's errors to statuses. What is not the
// client's doing is logged in full and answered without detail: it can
// name host paths.
func (s *Server) managerError(w http.ResponseWriter, err error) {
	status, msg := s.errorOf(err)
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		// A full server or one shutting down: the SDKs retry after it.
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, status, "%s", msg)
}

// public is msg unless it names one of the server's host directories (a
// message built from a cause that was not meant for clients): then a
// fixed sentence, and the message goes to the log. The last guard, not
// the first: errors are to be made fit for clients where they arise.
func (s *Server) public(msg string) string {
	for _, dir := range s.hostDirs {
		if strings.Contains(msg, dir) {
			s.log.Error("a refusal named a host path; the client was not told", "msg", msg)
			return "the request failed (the server log has the details)"
		}
	}
	return msg
}

// errorBody is E2B's error body.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// errorOf is the status and message a client gets for err.
func (s *Server) errorOf(err error) (int, string) {
	status, msg := s.statusOf(err)
	return status, s.public(msg)
}

func (s *Server) statusOf(err error) (int, string) {
	if pe := (*sandbox.PublicError)(nil); errors.As(err, &pe) && pe.Cause != nil {
		s.log.Warn("request refused", "err", pe.Err, "cause", pe.Cause)
	}
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return http.StatusNotFound, err.Error()
	case errors.Is(err, sandbox.ErrUnknownTemplate), errors.Is(err, sandbox.ErrInvalid):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, sandbox.ErrTooMany):
		return http.StatusTooManyRequests, err.Error()
	case errors.Is(err, sandbox.ErrConflict):
		return http.StatusConflict, err.Error()
	case errors.Is(err, sandbox.ErrShuttingDown), errors.Is(err, sandbox.ErrHostFull):
		return http.StatusServiceUnavailable, err.Error()
	case errors.Is(err, sandbox.ErrUnrestorable):
		// The manager's message names the sandbox only; the cause (host
		// paths, runsc's words) is logged.
		s.log.Error("request failed", "err", err)
		var u *sandbox.UnrestorableError
		errors.As(err, &u)
		return http.StatusInternalServerError, u.Public()
	default:
		s.log.Error("request failed", "err", err)
		return http.StatusInternalServerError, "internal error: the sandbox operation failed (the server log has the details)"
	}
}
