// Package httpapi is Airlock's HTTP face: the E2B-compatible control plane,
// the gateway to the agents inside sandboxes, health and metrics. It is
// the one place where errors become status codes.
package httpapi

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/audit"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/secret"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// Server serves the API.
type Server struct {
	m      *sandbox.Manager
	apiKey string
	domain string // sandboxes' hosts are {port}-{id}.{domain}
	log    *slog.Logger
	mux    *http.ServeMux
	proxy  *httputil.ReverseProxy // to agents
	ports  *httputil.ReverseProxy // to the servers in sandboxes
	// templates serves the build API (HandleTemplates); nil: none.
	templates *Templates
	// hostDirs are never named to clients (public).
	hostDirs []string
	// signedLimits slow each client's signed URLs that name no sandbox.
	signedLimits *clientLimits
	// patterns are the API's routes, as registered (Routes).
	patterns []string
	// netDefault is what creates that say nothing of the network get.
	netDefault NetDefault
	// volumes are the server's volumes (HandleVolumes), their tokens
	// derived from volumeKey; nil: none.
	volumes   *volume.Store
	volumeKey []byte
	// secrets are the server's secrets (HandleSecrets); nil: none.
	secrets *secret.Store
	// audit keeps the sandboxes' trails (HandleAudit); nil: none.
	audit *audit.Store
}

// New returns the API over m, guarded by apiKey, whose sandboxes' hosts
// are {port}-{sandboxID}.{domain}.
func New(m *sandbox.Manager, apiKey, domain string, log *slog.Logger) *Server {
	s := &Server{m: m, apiKey: apiKey, domain: domain, log: log, mux: http.NewServeMux(),
		signedLimits: newClientLimits(signedRate, signedBurst, maxClients)}
	if dir := m.StateDir(); dir != "" {
		s.hostDirs = append(s.hostDirs, dir)
	}
	if exe, err := os.Executable(); err == nil && filepath.Dir(exe) != "/" {
		s.hostDirs = append(s.hostDirs, filepath.Dir(exe))
	}
	s.proxy, s.ports = s.agentProxy(), s.portProxy()
	s.routes()
	return s
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "ok")
	})
	api := s.api
	// Behind the key too: templates, metadata and counts are the
	// operator's business (Prometheus sends it as a bearer token).
	api("GET /metrics", s.prometheus)
	api("POST /sandboxes", s.create)
	api("POST /v2/sandboxes", s.create)
	api("GET /sandboxes", s.list)
	api("GET /v2/sandboxes", s.list)
	api("GET /sandboxes/{id}", s.get)
	api("DELETE /sandboxes/{id}", s.kill)
	api("POST /sandboxes/{id}/timeout", s.setTimeout)
	api("POST /sandboxes/{id}/connect", s.connect)
	api("POST /v2/sandboxes/{id}/connect", s.connect)
	api("POST /sandboxes/{id}/resume", s.resume)
	api("GET /sandboxes/{id}/metrics", s.metrics)
	api("GET /sandboxes/metrics", s.metricsList)
	api("GET /sandboxes/{id}/logs", s.sandboxLogs)
	api("GET /v2/sandboxes/{id}/logs", s.sandboxLogsV2)
	api("POST /sandboxes/{id}/pause", s.pause)
	api("PUT /sandboxes/{id}/network", s.updateNetwork)
	api("GET /templates/{a}/{b}", s.templateGet)
	api("GET /templates", s.listTemplates)
	api("GET /v2/templates", s.listTemplatesV2)
	api("PATCH /templates/{id}", s.updateTemplate)
	api("PATCH /v2/templates/{id}", s.updateTemplate)
	// Airlock's own: the pools, for the console.
	api("GET /airlock/pools", s.pools)
	// A pool's size, set at run time (a cluster's AirlockPools), and back
	// to the configuration.
	api("PUT /airlock/pools/{template}", s.setPoolSize)
	api("DELETE /airlock/pools/{template}", s.resetPoolSize)
	s.handleSnapshots()
}

// api serves h at pattern to clients with the API key, as one of the
// API's routes.
func (s *Server) api(pattern string, h http.HandlerFunc) {
	s.patterns = append(s.patterns, pattern)
	if strings.Contains(pattern, "/sandboxes/{id}") && !strings.HasPrefix(pattern, "GET ") {
		// An action on a sandbox: its trail says who, what, and how it
		// went (reads are not actions).
		inner := h
		h = func(w http.ResponseWriter, r *http.Request) {
			sw := &statusRecorder{ResponseWriter: w}
			inner(sw, r)
			s.auditAction(r, r.PathValue("id"), pattern, sw.status)
		}
	}
	s.mux.Handle(pattern, s.auth(h))
}

// Routes are the patterns of the API's routes (E2B's and Airlock's own),
// in the order they were registered: what a test of the whole API goes
// through.
func (s *Server) Routes() []string { return slices.Clone(s.patterns) }

// ServeHTTP routes sandbox traffic to the gateway: requests that carry
// E2b-Sandbox-Id (the SDKs, with E2B_SANDBOX_URL set) or whose host is
// {port}-{sandboxID}.{domain} (getHost). Everything else goes to the
// control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		s.gateway(w, r, id, r.Header.Get("E2b-Sandbox-Port"))
		return
	}
	if port, id, ok := s.sandboxHost(r.Host); ok {
		s.gateway(w, r, id, port)
		return
	}
	if r.URL.Path == agentproto.FilesPath && r.URL.Query().Has("signature") {
		if !s.signedLimits.allow(r.RemoteAddr) {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, "too many signed file URLs from this address: try again later")
			return
		}
		sb, no := s.signedSandbox(r)
		if no != nil {
			writeError(w, no.status, "%s", no.msg)
			return
		}
		s.gateway(w, r, sb.ID, agentproto.EnvdPort)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// auth requires the API key, in X-API-KEY as E2B's SDKs send it or as a
// bearer token as MCP clients do.
func (s *Server) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := requestKey(r)
		if key == "" || subtle.ConstantTimeCompare([]byte(key), []byte(s.apiKey)) != 1 {
			writeError(w, http.StatusUnauthorized, "invalid or missing API key (X-API-KEY or Authorization: Bearer)")
			return
		}
		h(w, r)
	})
}

// requestKey is the API key r presents: X-API-KEY, or a bearer token.
func requestKey(r *http.Request) string {
	key := r.Header.Get("X-API-KEY")
	if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); key == "" && ok && strings.EqualFold(scheme, "Bearer") {
		key = token
	}
	return key
}

// HandlePublic serves h at pattern to anyone who reaches the listener:
// pages whose every action calls the API with the key (the console).
func (s *Server) HandlePublic(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// HandleAuthenticated serves h at pattern to clients with the API key.
func (s *Server) HandleAuthenticated(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.auth(h.ServeHTTP))
}
