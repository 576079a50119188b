// Package httpapi is Airlock's HTTP face: the E2B-compatible control plane,
// the gateway to the agents inside sandboxes, health and metrics. It is
// the one place where errors become status codes.
package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandboxid"
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
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", "agent", "agent"
			// The agent needs no credential; none should linger.
			for _, h := range credentialHeaders {
				pr.Out.Header.Del(h)
			}
			sb, _ := pr.In.Context().Value(sandboxKey{}).(*sandbox.Sandbox)
			s.agentAuthorization(pr.Out.Header, sb)
		},
		ModifyResponse: func(resp *http.Response) error {
			if resp.Request.URL.Path == agentproto.FilesPath {
				fileAnswer(resp)
			}
			return nil
		},
		// Each request goes to the agent of the sandbox it was routed to.
		Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			return r.Context().Value(sandboxKey{}).(*sandbox.Sandbox).Transport().RoundTrip(r)
		}),
		FlushInterval: -1, // streams go out as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// The error names host sockets: log it, never send it.
			if !errors.Is(err, context.Canceled) {
				s.log.Warn("gateway", "sandbox", r.Header.Get("E2b-Sandbox-Id"), "err", err)
			}
			writeError(w, http.StatusBadGateway, "the sandbox's agent is not reachable")
		},
	}
	s.ports = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			sb := pr.In.Context().Value(sandboxKey{}).(*sandbox.Sandbox)
			port := pr.In.Context().Value(portKey{}).(int)
			pr.Out.URL.Scheme = "http"
			if slices.Contains(sb.Ingress.HTTPSPorts, port) {
				pr.Out.URL.Scheme = "https"
			}
			pr.Out.URL.Host = "127.0.0.1:" + strconv.Itoa(port)
			pr.Out.Host = pr.In.Host
			if mask := sb.Ingress.MaskHost; mask != "" {
				pr.Out.Host = strings.ReplaceAll(mask, "${PORT}", strconv.Itoa(port))
			}
			pr.SetXForwarded()
			// Airlock's own headers and credentials stay out of the
			// sandbox's servers.
			for _, h := range credentialHeaders {
				pr.Out.Header.Del(h)
			}
			pr.Out.Header.Del("E2b-Sandbox-Id")
			pr.Out.Header.Del("E2b-Sandbox-Port")
			s.dropKeyAuthorization(pr.Out.Header, sb)
		},
		Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			return r.Context().Value(sandboxKey{}).(*sandbox.Sandbox).PortTransport().RoundTrip(r)
		}),
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			port := r.Context().Value(portKey{}).(int)
			if errors.Is(err, agentproto.ErrForwardRefused) {
				writeError(w, http.StatusBadGateway, "no server listens on port %d in the sandbox", port)
				return
			}
			if !errors.Is(err, context.Canceled) {
				s.log.Info("gateway to a sandbox port", "port", port, "err", err)
			}
			writeError(w, http.StatusBadGateway, "the server on port %d in the sandbox did not answer", port)
		},
	}
	s.routes()
	return s
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "ok")
	})
	api := func(pattern string, h http.HandlerFunc) { s.mux.Handle(pattern, s.auth(h)) }
	// Behind the key too: templates, metadata and counts are the
	// operator's business (Prometheus sends it as a bearer token).
	api("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		running, pooled := s.m.Counts()
		s.m.Metrics().Write(w, running, pooled)
	})
	api("POST /sandboxes", s.create)
	api("POST /v2/sandboxes", s.create)
	api("GET /sandboxes", s.list)
	api("GET /v2/sandboxes", s.list)
	api("GET /sandboxes/{id}", s.get)
	api("DELETE /sandboxes/{id}", s.kill)
	api("POST /sandboxes/{id}/timeout", s.setTimeout)
	api("POST /sandboxes/{id}/connect", s.connect)
	api("POST /v2/sandboxes/{id}/connect", s.connect)
	api("POST /sandboxes/{id}/resume", s.connect)
	api("GET /sandboxes/{id}/metrics", s.metrics)
	api("POST /sandboxes/{id}/pause", s.pause)
	api("PUT /sandboxes/{id}/network", s.updateNetwork)
	api("GET /templates/{a}/{b}", s.templateGet)
	// Airlock's own: the pools, for the console.
	api("GET /airlock/pools", func(w http.ResponseWriter, r *http.Request) {
		pools, budget := s.m.Pools(r.Context())
		if pools == nil {
			pools = []sandbox.PoolStatus{}
		}
		running, _ := s.m.Counts()
		n := 0
		for _, c := range running {
			n += c
		}
		writeJSON(w, http.StatusOK, map[string]any{"pools": pools, "memoryBudgetBytes": budget, "running": n})
	})
	// A pool's size, set at run time (a cluster's AirlockPools), and back
	// to the configuration.
	api("PUT /airlock/pools/{template}", s.setPoolSize)
	api("DELETE /airlock/pools/{template}", func(w http.ResponseWriter, r *http.Request) {
		s.m.SetPoolSize(r.PathValue("template"), -1)
		w.WriteHeader(http.StatusNoContent)
	})
	s.handleSnapshots()
}

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
		sb := s.signedSandbox(r)
		if sb == nil {
			writeError(w, http.StatusUnauthorized, "the file URL's signature is not valid, or it has expired")
			return
		}
		s.gateway(w, r, sb.ID, agentproto.EnvdPort)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// MaxPoolSize bounds a pool's size set through the API.
const MaxPoolSize = 256

func (s *Server) setPoolSize(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"size"}, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var body struct {
		Size *int `json:"size"`
	}
	if !unmarshal(w, raw, &body) {
		return
	}
	if body.Size == nil || *body.Size < 0 || *body.Size > MaxPoolSize {
		writeError(w, http.StatusBadRequest, "size must be an integer from 0 to %d", MaxPoolSize)
		return
	}
	s.m.SetPoolSize(r.PathValue("template"), *body.Size)
	w.WriteHeader(http.StatusNoContent)
}

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

// auth requires the API key, in X-API-KEY as E2B's SDKs send it or as a
// bearer token as MCP clients do.
func (s *Server) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-KEY")
		if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); key == "" && ok && strings.EqualFold(scheme, "Bearer") {
			key = token
		}
		if key == "" || subtle.ConstantTimeCompare([]byte(key), []byte(s.apiKey)) != 1 {
			writeError(w, http.StatusUnauthorized, "invalid or missing API key (X-API-KEY or Authorization: Bearer)")
			return
		}
		h(w, r)
	})
}

// HandlePublic serves h at pattern to anyone who reaches the listener:
// pages whose every action calls the API with the key (the console).
func (s *Server) HandlePublic(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// HandleAuthenticated serves h at pattern to clients with the API key.
func (s *Server) HandleAuthenticated(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.auth(h.ServeHTTP))
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

type createBody struct {
	TemplateID          string            `json:"templateID"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Timeout             *int64            `json:"timeout"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             json.RawMessage   `json:"network"`
	AutoPause           bool              `json:"autoPause"`
	// AutoPauseMemory false: that pause keeps only the files.
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	// AutoResume: traffic to the paused sandbox resumes it.
	AutoResume *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	// Backend is Airlock's own: the isolation of this sandbox, where the
	// server allows a request to choose it.
	Backend string `json:"backend"`
	// Secure (older SDKs) asks for an access token: every sandbox here
	// has one.
	Secure bool `json:"secure"`
}

// createFields are the fields of a create request this server
// implements; others (mcp, volumeMounts, iam, …) are refused.
var createFields = []string{"templateID", "metadata", "envVars", "timeout", "allow_internet_access", "network",
	"autoPause", "autoPauseMemory", "autoResume", "backend", "secure"}

// sandboxJSON is the Sandbox object of create and connect.
type sandboxJSON struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

func (s *Server) sandboxObject(sb *sandbox.Sandbox) sandboxJSON {
	return sandboxJSON{
		TemplateID: sb.TemplateID, SandboxID: sb.ID, ClientID: sb.ClientID,
		EnvdVersion: agentproto.EnvdVersion, EnvdAccessToken: sb.AccessToken, TrafficAccessToken: &sb.TrafficToken,
		Domain: &s.domain,
	}
}

const maxBody = 1 << 20

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.ContentLength == 0 {
		return true
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return false
	}
	return true
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, createFields, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var b createBody
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return
	}
	if b.TemplateID == "" {
		b.TemplateID = "base"
	}
	var nb *networkBody
	if !isEmptyJSON(b.Network) && len(b.Network) > 0 {
		if err := refuseUnknown(b.Network, networkFields, "network."); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		nb = new(networkBody)
		if err := json.Unmarshal(b.Network, nb); err != nil {
			writeError(w, http.StatusBadRequest, "network: %v", err)
			return
		}
	}
	var allowOut, denyOut *[]string
	if nb != nil {
		allowOut, denyOut = nb.AllowOut, nb.DenyOut
	}
	netPol, err := egress(b.AllowInternetAccess, allowOut, denyOut)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	ingress, err := nb.ingress()
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	pauseFiles := b.AutoPauseMemory != nil && !*b.AutoPauseMemory
	if pauseFiles && b.AutoResume != nil && b.AutoResume.Enabled {
		// As E2B: nothing runs in it to take the traffic.
		writeError(w, http.StatusBadRequest, "autoResume cannot resume a sandbox whose pause keeps only its files (autoPauseMemory false): resume it with connect")
		return
	}
	var ttl time.Duration
	if b.Timeout != nil {
		if *b.Timeout <= 0 {
			writeError(w, http.StatusBadRequest, "timeout must be a positive number of seconds")
			return
		}
		ttl = seconds(*b.Timeout)
	}
	for k, v := range b.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			writeError(w, http.StatusBadRequest, "invalid environment variable %q", k)
			return
		}
	}
	sb, err := s.m.Create(r.Context(), sandbox.CreateRequest{
		TemplateID: b.TemplateID, Metadata: b.Metadata, EnvVars: b.EnvVars, TTL: ttl, ClientID: "airlock",
		Backend: b.Backend, AutoPause: b.AutoPause, AutoResume: b.AutoResume != nil && b.AutoResume.Enabled,
		AutoPauseFiles: pauseFiles, Network: netPol, Ingress: ingress,
	})
	if err != nil {
		s.managerError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxObject(sb))
}

// listItem is one sandbox in a list, or the detail of one.
type listItem struct {
	TemplateID          string            `json:"templateID"`
	SandboxID           string            `json:"sandboxID"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	CPUCount            float64           `json:"cpuCount"`
	MemoryMB            int64             `json:"memoryMB"`
	DiskSizeMB          int64             `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Network             *networkInfo      `json:"network,omitempty"`
	Lifecycle           *lifecycle        `json:"lifecycle,omitempty"`
	Domain              *string           `json:"domain,omitempty"`
	// Backend is Airlock's own: which isolation the sandbox has.
	Backend string `json:"backend,omitempty"`
}

// lifecycle is E2B's SandboxLifecycle: what the timeout does, and whether
// traffic resumes a paused sandbox.
type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func item(sb *sandbox.Sandbox) listItem {
	return listItem{
		TemplateID: sb.TemplateID, SandboxID: sb.ID, ClientID: sb.ClientID,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt().UTC(), CPUCount: sb.CPUs,
		MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, Metadata: sb.Metadata,
		State: state(sb), EnvdVersion: agentproto.EnvdVersion, Backend: sb.BackendName(),
	}
}

func state(sb *sandbox.Sandbox) string {
	if sb.Paused() {
		return "paused"
	}
	return "running"
}

// parseMetadataFilter reads ?metadata=, an URL-encoded "k=v&k2=v2" whose
// keys and values the SDK encoded once more.
func parseMetadataFilter(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, vs := range vals {
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, err
		}
		val, err := url.QueryUnescape(vs[len(vs)-1])
		if err != nil {
			return nil, err
		}
		out[key] = val
	}
	return out, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	filter, err := parseMetadataFilter(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid metadata filter: %v", err)
		return
	}
	all := s.m.List(filter) // oldest first
	// Newest first unless ?order=asc, as on E2B.
	desc := true
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		desc = false
	default:
		writeError(w, http.StatusBadRequest, "order must be asc or desc, not %q", q.Get("order"))
		return
	}
	if desc {
		slices.Reverse(all)
	}
	if v := q.Get("startedAfter"); v != "" {
		after, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "startedAfter %q is not an RFC 3339 time", v)
			return
		}
		kept := all[:0]
		for _, sb := range all {
			if !sb.StartedAt.Before(after) {
				kept = append(kept, sb)
			}
		}
		all = kept
	}
	// ?state=running,paused (repeated or comma-separated): those states only.
	if states := q["state"]; len(states) > 0 {
		want := map[string]bool{}
		for _, v := range states {
			for _, st := range strings.Split(v, ",") {
				want[strings.TrimSpace(st)] = true
			}
		}
		kept := all[:0]
		for _, sb := range all {
			if want[state(sb)] {
				kept = append(kept, sb)
			}
		}
		all = kept
	}
	if tmpl := q.Get("template"); tmpl != "" {
		kept := all[:0]
		for _, sb := range all {
			if sb.TemplateID == tmpl {
				kept = append(kept, sb)
			}
		}
		all = kept
	}
	// Paging: the page starts after the place nextToken marks, even when
	// the sandbox there is gone (a client that kills what it lists).
	if tok := q.Get("nextToken"); tok != "" {
		after, ok := afterToken(tok, desc)
		if !ok {
			writeError(w, http.StatusBadRequest, "invalid nextToken: pass on the X-Next-Token of the previous page")
			return
		}
		for len(all) > 0 && !after(all[0]) {
			all = all[1:]
		}
	}
	limit, err := pageLimit(q.Get("limit"), len(all))
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if limit < len(all) {
		w.Header().Set("X-Next-Token", pageToken(all[limit-1]))
	}
	items := make([]listItem, 0, limit)
	for _, sb := range all[:limit] {
		items = append(items, item(sb))
	}
	writeJSON(w, http.StatusOK, items)
}

// pageToken marks sb's place in a list, ordered by start time, then id.
func pageToken(sb *sandbox.Sandbox) string {
	return strconv.FormatInt(sb.StartedAt.UnixNano(), 10) + "." + sb.ID
}

// afterToken returns whether a sandbox comes after the place tok marks,
// in a list newest first (desc) or oldest first.
func afterToken(tok string, desc bool) (func(*sandbox.Sandbox) bool, bool) {
	ns, id, ok := strings.Cut(tok, ".")
	at, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil {
		return nil, false
	}
	return func(sb *sandbox.Sandbox) bool {
		t := sb.StartedAt.UnixNano()
		later := t > at || t == at && sb.ID > id
		same := t == at && sb.ID == id
		return !same && later != desc
	}, true
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.PathValue("id"))
	if err != nil {
		s.managerError(w, err)
		return
	}
	it := item(sb)
	it.EnvdAccessToken = sb.AccessToken
	internet, info := networkOf(sb)
	it.AllowInternetAccess, it.Network = &internet, &info
	it.Lifecycle = &lifecycle{AutoResume: sb.AutoResume, OnTimeout: sb.OnTimeout()}
	it.Domain = &s.domain
	writeJSON(w, http.StatusOK, it)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	if err := s.m.Kill(r.PathValue("id")); err != nil {
		s.managerError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// seconds is a client's timeout of n seconds. One longer than a Duration
// holds is the longest Duration, which the manager refuses as above its
// maximum, rather than a product wrapped around to any value at all.
func seconds(n int64) time.Duration {
	if n > int64(math.MaxInt64/time.Second) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Second
}

type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var b timeoutBody
	if !decode(w, r, &b) {
		return
	}
	if b.Timeout == nil || *b.Timeout <= 0 {
		writeError(w, http.StatusBadRequest, "timeout must be a positive number of seconds")
		return
	}
	if err := s.m.SetTTL(r.PathValue("id"), seconds(*b.Timeout)); err != nil {
		s.managerError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect returns a running sandbox; a timeout in the body extends its
// time to live (never shortens it), as E2B does.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	var b timeoutBody
	if !decode(w, r, &b) {
		return
	}
	id := r.PathValue("id")
	sb, err := s.m.Get(id)
	if err != nil {
		s.managerError(w, err)
		return
	}
	var d time.Duration
	if b.Timeout != nil && *b.Timeout > 0 {
		d = seconds(*b.Timeout)
	}
	// Connecting to a paused sandbox resumes it, with the timeout asked
	// for (or the default).
	if sb.Paused() {
		if err := s.m.Resume(r.Context(), id, d); err != nil {
			s.managerError(w, err)
			return
		}
	} else if d > 0 {
		if time.Until(sb.EndAt()) < d {
			if err := s.m.SetTTL(id, d); err != nil {
				s.managerError(w, err)
				return
			}
		}
	}
	writeJSON(w, http.StatusOK, s.sandboxObject(sb))
}

// pause stops every process of a sandbox; connect resumes it. With
// {"memory": false} it keeps only the sandbox's files.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Memory *bool `json:"memory"`
	}
	if !decode(w, r, &b) {
		return
	}
	if err := s.m.Pause(r.Context(), r.PathValue("id"), b.Memory == nil || *b.Memory); err != nil {
		s.managerError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.PathValue("id"))
	if err != nil {
		s.managerError(w, err)
		return
	}
	metric := func(at time.Time, u sandbox.Usage) map[string]any {
		return map[string]any{
			"timestamp":     at,
			"timestampUnix": at.Unix(),
			"cpuCount":      sb.CPUs,
			"cpuUsedPct":    math.Round(u.CPUPercent*100) / 100,
			"memUsed":       u.Memory,
			"memTotal":      sb.MemoryMB << 20,
			"diskUsed":      u.Disk,
			"diskTotal":     sb.DiskMB << 20,
		}
	}
	// ?start=&end= (Unix seconds): the samples taken then (the last hour
	// is kept); without them, one measured now.
	q := r.URL.Query()
	if q.Has("start") || q.Has("end") {
		start, end := time.Unix(0, 0), time.Now()
		for name, dst := range map[string]*time.Time{"start": &start, "end": &end} {
			if v := q.Get(name); v != "" {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil || n < 0 {
					writeError(w, http.StatusBadRequest, "%s must be a Unix time in seconds, not %q", name, v)
					return
				}
				*dst = time.Unix(n, 0)
			}
		}
		if end.Before(start) {
			writeError(w, http.StatusBadRequest, "end is before start")
			return
		}
		// end is a whole second: the samples of all of it.
		out := []map[string]any{}
		for _, sm := range sb.History(start, end.Add(time.Second-1)) {
			out = append(out, metric(sm.At, sm.Usage))
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	u, err := sb.Usage(r.Context())
	if err != nil {
		s.managerError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, []map[string]any{metric(time.Now().UTC(), u)})
}

// gateway passes sandbox traffic on: to the sandbox's agent for its own
// ports (envd, code interpreter), once the sandbox's token was shown, and
// to the servers that processes in the sandbox run for any other port.
func (s *Server) gateway(w http.ResponseWriter, r *http.Request, id, port string) {
	agentPort := port == agentproto.EnvdPort || port == agentproto.InterpreterPort
	sb, err := s.m.Get(id)
	if err != nil {
		// 502, as E2B's own proxy answers for a sandbox that is gone: the
		// SDKs read it as "not running" (isRunning) or a timeout. On the
		// agent's ports only to a client that holds the sandbox's token
		// (tokens.go): to anyone else, a gone sandbox and a live one look
		// alike. Other ports are public by default and tell anyway.
		if agentPort && !s.m.Issued(id, r.Header.Get("X-Access-Token"), false) &&
			!(port == agentproto.InterpreterPort && s.m.Issued(id, r.Header.Get("E2B-Traffic-Access-Token"), true)) {
			writeError(w, http.StatusUnauthorized, "invalid or missing access token for this sandbox")
			return
		}
		writeError(w, http.StatusBadGateway, "sandbox not found: it was killed or its timeout passed")
		return
	}
	if !agentPort {
		s.portGateway(w, r, sb, port)
		return
	}
	// envd needs the sandbox's access token; its other ports take the
	// traffic token too (the SDKs send only that for some calls).
	token := sb.CheckToken(r.Header.Get("X-Access-Token")) ||
		(port != agentproto.EnvdPort && sb.CheckTrafficToken(r.Header.Get("E2B-Traffic-Access-Token")))
	signed := !token && port == agentproto.EnvdPort && signedFor(r, sb)
	if !token && !signed {
		writeError(w, http.StatusUnauthorized, "invalid or missing access token for this sandbox")
		return
	}
	if signed {
		// A signed URL acts as the user it was signed for, whom its
		// query names: an Authorization header, where envd reads the
		// user first, must not name another (root).
		r.Header.Del("Authorization")
	}
	// The agent's private endpoints are the daemon's alone.
	if strings.HasPrefix(r.URL.Path, agentproto.SetupPath) {
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	if !s.awake(w, r, sb) {
		return
	}
	if r.URL.Path == agentproto.StartProcedure {
		s.m.Metrics().Execs.Add(1)
	}
	// The agent tells the two ports apart by this header, which a
	// request by host name does not carry.
	r.Header.Set("E2b-Sandbox-Port", port)
	// Streams answer while their request may still be read (the
	// transport reads the body to its end after sending it): without full
	// duplex, Go's server ends the request body as soon as the response
	// starts, and the transport then drops the connection mid-stream.
	_ = http.NewResponseController(w).EnableFullDuplex()
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, sb)))
}

// portGateway passes a request to the server listening on port inside
// the sandbox, through its agent: E2B's getHost(port). Without
// allowPublicTraffic it needs the sandbox's traffic token.
func (s *Server) portGateway(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port string) {
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		writeError(w, http.StatusBadRequest, "sandbox port %q is not a port number", port)
		return
	}
	if !sb.Ingress.Public && !sb.CheckTrafficToken(r.Header.Get("E2B-Traffic-Access-Token")) {
		writeError(w, http.StatusUnauthorized, "this sandbox's ports need its traffic access token (e2b-traffic-access-token)")
		return
	}
	if !s.awake(w, r, sb) {
		return
	}
	_ = http.NewResponseController(w).EnableFullDuplex()
	ctx := context.WithValue(r.Context(), sandboxKey{}, sb)
	s.ports.ServeHTTP(w, r.WithContext(context.WithValue(ctx, portKey{}, n)))
}

// awake reports whether sb can take traffic: a paused sandbox is resumed
// if it asked for that, else the client is told so at once (a paused
// agent would never answer).
func (s *Server) awake(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox) bool {
	if !sb.Paused() {
		return true
	}
	if !sb.AutoResume {
		writeError(w, http.StatusBadGateway, "the sandbox is paused: connect to it to resume it")
		return false
	}
	if err := s.m.Resume(r.Context(), sb.ID, 0); err != nil {
		s.managerError(w, err)
		return false
	}
	return true
}

// sandboxHost reads a host of the form {port}-{sandboxID}.{domain}, as
// the SDKs' getHost builds it (sandboxid.ParseHost, as routers do).
func (s *Server) sandboxHost(host string) (port, id string, ok bool) {
	return sandboxid.ParseHost(host, s.domain)
}

type sandboxKey struct{}

type portKey struct{}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// pageLimit is a list's page size: the query's limit, at most n (all).
func pageLimit(limit string, n int) (int, error) {
	if limit == "" {
		return n, nil
	}
	l, err := strconv.Atoi(limit)
	if err != nil || l < 1 {
		return 0, errors.New("limit must be a positive integer")
	}
	return min(l, n), nil
}
