package httpapi

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Sandboxes: E2B's create, list, get, kill, setTimeout, connect and
// pause.

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
	Secure       bool `json:"secure"`
	VolumeMounts []struct {
		Name string `json:"name"`
		Path string `json:"path"`
	} `json:"volumeMounts"`
}

// createFields are the fields of a create request this server
// implements; others (mcp, iam, …) are refused.
var createFields = []string{"templateID", "metadata", "envVars", "timeout", "allow_internet_access", "network",
	"autoPause", "autoPauseMemory", "autoResume", "backend", "secure", "volumeMounts"}

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
	netPol, err := egress(s.netDefault, true, b.AllowInternetAccess, allowOut, denyOut)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if nb != nil {
		if netPol.Rules, err = s.requestRules(nb.Rules); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		if len(netPol.Rules) > 0 && netPol.Mode == policy.NetNone {
			writeError(w, http.StatusBadRequest, "network.rules need a network: this sandbox would have loopback only")
			return
		}
		if netPol.EgressProxy, err = egressProxy(r.Context(), nb.EgressProxy); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		if netPol.EgressProxy != nil && netPol.Mode == policy.NetNone {
			writeError(w, http.StatusBadRequest, "network.egressProxy needs a network: this sandbox would have loopback only")
			return
		}
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
	vms, err := volumeMounts(b.VolumeMounts)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	sb, err := s.m.Create(r.Context(), sandbox.CreateRequest{
		TemplateID: b.TemplateID, Metadata: b.Metadata, EnvVars: b.EnvVars, TTL: ttl, ClientID: "airlock",
		Backend: b.Backend, AutoPause: b.AutoPause, AutoResume: b.AutoResume != nil && b.AutoResume.Enabled,
		AutoPauseFiles: pauseFiles, Network: netPol, Ingress: ingress, Volumes: vms,
	})
	if err != nil {
		s.managerError(w, err)
		return
	}
	s.auditAction(r, sb.ID, r.Method+" "+r.URL.Path, http.StatusCreated)
	writeJSON(w, http.StatusCreated, s.sandboxObject(sb))
}

// listItem is one sandbox in a list, or the detail of one.
type listItem struct {
	TemplateID          string            `json:"templateID"`
	SandboxID           string            `json:"sandboxID"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	CPUCount            int64             `json:"cpuCount"` // whole cores, as E2B's: cpuCount
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
	Backend      string                `json:"backend,omitempty"`
	VolumeMounts []sandbox.VolumeMount `json:"volumeMounts"`
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
		StartedAt: sb.StartedAt, EndAt: sb.EndAt().UTC(), CPUCount: cpuCount(sb.CPUs),
		MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, Metadata: sb.Metadata,
		State: state(sb), EnvdVersion: agentproto.EnvdVersion, Backend: sb.BackendName(),
		VolumeMounts: append([]sandbox.VolumeMount{}, sb.VolumeMounts...),
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

// connect returns a running sandbox (200), resuming a paused one (201);
// a timeout in the body extends its time to live (never shortens it), as
// E2B does.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) { s.connectOrResume(w, r, false) }

// resume is E2B's older resume: a paused sandbox resumed (201), a
// running one refused (409), as E2B's.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) { s.connectOrResume(w, r, true) }

func (s *Server) connectOrResume(w http.ResponseWriter, r *http.Request, pausedOnly bool) {
	var b struct {
		timeoutBody
		// Memory false: the SDK's onResume 'reboot', a paused sandbox
		// resumed from its files only, its processes and memory dropped.
		Memory *bool `json:"memory"`
	}
	if !decode(w, r, &b) {
		return
	}
	id := r.PathValue("id")
	sb, err := s.m.Get(id)
	if err != nil {
		s.managerError(w, err)
		return
	}
	status := http.StatusOK
	if sb.Paused() {
		status = http.StatusCreated
	} else if pausedOnly {
		writeError(w, http.StatusConflict, "sandbox %s is already running", id)
		return
	}
	var d time.Duration
	if b.Timeout != nil && *b.Timeout > 0 {
		d = seconds(*b.Timeout)
	}
	// Connecting to a paused sandbox resumes it, with the timeout asked
	// for (or the default).
	if sb.Paused() {
		resume := s.m.Resume
		if b.Memory != nil && !*b.Memory && sb.State() != sandbox.SavedFiles {
			resume = s.m.Reboot
		}
		if err := resume(r.Context(), id, d); err != nil {
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
	writeJSON(w, status, s.sandboxObject(sb))
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
