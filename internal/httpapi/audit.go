package httpapi

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/audit"
)

// HandleAudit serves the sandboxes' audit trails of store (Airlock's own
// routes), and has every action of the API on a sandbox written down in
// its trail.
//
//	GET /sandboxes/{id}/audit                 {"events": [...]}
//	GET /sandboxes/{id}/audit?format=jsonl    one event a line
//	GET /sandboxes/{id}/audit?format=otlp     OpenTelemetry logs (OTLP/JSON)
//	GET /sandboxes/{id}/audit/allowlist       the allowOut that covers what it reached
//
// A trail outlives its sandbox (config audit.retention).
func (s *Server) HandleAudit(store *audit.Store) {
	s.audit = store
	s.api("GET /sandboxes/{id}/audit", s.getAudit)
	s.api("GET /sandboxes/{id}/audit/allowlist", s.getAllowlist)
}

func (s *Server) readAudit(w http.ResponseWriter, id string) ([]audit.Event, bool) {
	events, err := s.audit.Read(id)
	switch {
	case errors.Is(err, audit.ErrNotFound):
		writeError(w, http.StatusNotFound, "no audit trail for sandbox %q (never written, or past its retention)", id)
		return nil, false
	case err != nil:
		s.log.Error("audit trail", "sandbox", id, "err", err)
		writeError(w, http.StatusInternalServerError, "internal error: the audit trail could not be read (the server log has the details)")
		return nil, false
	}
	if events == nil {
		events = []audit.Event{}
	}
	return events, true
}

func (s *Server) getAudit(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	format := r.URL.Query().Get("format")
	if format != "" && format != "json" && format != "jsonl" && format != "otlp" {
		writeError(w, http.StatusBadRequest, "format %q: json, jsonl or otlp", format)
		return
	}
	events, ok := s.readAudit(w, id)
	if !ok {
		return
	}
	switch format {
	case "jsonl":
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, e := range events {
			enc.Encode(e)
		}
	case "otlp":
		writeJSON(w, http.StatusOK, audit.OTLP(id, events))
	default:
		writeJSON(w, http.StatusOK, map[string]any{"sandboxID": id, "events": events})
	}
}

// getAllowlist is learning mode's answer: the smallest allowOut that
// covers every host the sandbox reached or tried to.
func (s *Server) getAllowlist(w http.ResponseWriter, r *http.Request) {
	events, ok := s.readAudit(w, r.PathValue("id"))
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, audit.Propose(events))
}

// auditAction writes an action of the API on sandbox id down in its
// trail: who (the key's fingerprint, the client's address), what (the
// route), and the answer's status.
func (s *Server) auditAction(r *http.Request, id, action string, status int) {
	if s.audit == nil || id == "" {
		return
	}
	key := requestKey(r)
	client, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		client = r.RemoteAddr
	}
	s.audit.Record(id, audit.Event{Kind: "api", Actor: "key " + apikey.Fingerprint(key) + " from " + client, Action: action, Status: status})
}

// statusRecorder remembers the status of an answer; Unwrap lets
// http.ResponseController reach the writer beneath.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
