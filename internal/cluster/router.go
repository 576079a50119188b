package cluster

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/airlock-sandbox/airlock/internal/sandboxid"
)

// Router is the E2B-compatible entry point of a cluster: stateless, any
// number behind one Service. A create goes to a node with a ready pooled
// sandbox of its template, else to the least loaded; every later request
// of a sandbox, control plane and envd traffic alike, goes to the node
// its id names; lists ask every node.
type Router struct {
	key    string
	domain string // sandboxes' servers answer at {port}-{id}.domain
	nodes  *nodeSet
	proxy  *httputil.ReverseProxy
	client *http.Client
	log    *slog.Logger
	// uploads bounds the signed uploads held in memory at once.
	uploads chan struct{}
	// Console serves the web console's page and assets (nil: none).
	Console http.Handler
}

// maxBody bounds the control-plane bodies the router reads (creates).
const maxBody = 1 << 20

// NewRouter starts watching the nodes of namespace and returns once it
// has listed them.
func NewRouter(ctx context.Context, client dynamic.Interface, namespace, key, domain string, log *slog.Logger) (*Router, error) {
	nodes := newNodeSet(client.Resource(nodesResource).Namespace(namespace), client.Resource(leasesResource).Namespace(namespace), log)
	if err := nodes.start(ctx); err != nil {
		return nil, err
	}
	return newRouter(nodes, key, domain, log), nil
}

// newRouter routes over nodes, which are being watched.
func newRouter(nodes *nodeSet, key, domain string, log *slog.Logger) *Router {
	rt := &Router{key: key, domain: domain, nodes: nodes, log: log, uploads: make(chan struct{}, signedUploads)}
	transport := &http.Transport{
		// A node that is gone must fail fast: its sandboxes then answer
		// 404 rather than hang.
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	rt.client = &http.Client{Transport: transport, Timeout: 2 * time.Minute}
	rt.proxy = &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			rt := pr.In.Context().Value(routeKey{}).(route)
			pr.SetURL(rt.node.target) // parsed and checked with its record
			pr.Out.Host = pr.In.Host
			// Set here, after the proxy dropped the hop-by-hop headers: a
			// client's "Connection: E2b-Sandbox-Id" must not turn sandbox
			// traffic, which the router let through without the API key,
			// into a control-plane request on the node.
			if rt.sandboxTraffic {
				pr.Out.Header.Set("E2b-Sandbox-Id", rt.id)
				if rt.port != "" {
					pr.Out.Header.Set("E2b-Sandbox-Port", rt.port)
				}
			}
			// X-Forwarded-* are the router's to set, not a client's.
			pr.SetXForwarded()
		},
		FlushInterval:  -1, // streams (commands, watches, kernels) pass at once
		ModifyResponse: rt.rewriteDomain,
		ErrorHandler:   rt.proxyError,
	}
	return rt
}

// route is where the proxy sends a request: to node, for sandbox id;
// sandbox traffic (envd's, the code interpreter's, ports') goes by the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers.
type route struct {
	node           node
	id, port       string
	sandboxTraffic bool
}

type routeKey struct{}

// ServeHTTP routes: sandbox traffic by the id it names, the control plane
// by path.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		rt.toSandbox(w, r, route{id: id, port: r.Header.Get("E2b-Sandbox-Port"), sandboxTraffic: true})
		return
	}
	if port, id, ok := rt.sandboxHost(r.Host); ok {
		// One mechanism on the nodes: a request by host name is passed
		// on as the SDKs' own requests are, by header.
		rt.toSandbox(w, r, route{id: id, port: port, sandboxTraffic: true})
		return
	}
	if r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		rt.signedFile(w, r)
		return
	}
	path := r.URL.Path
	switch {
	case path == "/health":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case rt.Console != nil && r.Method == http.MethodGet && (path == "/" || strings.HasPrefix(path, "/assets/")):
		rt.Console.ServeHTTP(w, r)
	case !rt.authorized(r):
		writeError(w, http.StatusUnauthorized, "invalid or missing API key (X-API-KEY or Authorization: Bearer)")
	case r.Method == http.MethodPost && (path == "/sandboxes" || path == "/v2/sandboxes"):
		rt.create(w, r)
	case r.Method == http.MethodGet && (path == "/sandboxes" || path == "/v2/sandboxes"):
		rt.list(w, r)
	case r.Method == http.MethodGet && path == "/snapshots":
		rt.listSnapshots(w, r)
	case r.Method == http.MethodGet && path == "/airlock/pools":
		rt.pools(w, r)
	case r.Method == http.MethodGet && path == "/airlock/nodes":
		writeJSON(w, http.StatusOK, rt.nodes.live())
	case strings.HasPrefix(path, "/sandboxes/") || strings.HasPrefix(path, "/v2/sandboxes/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(path, "/v2"), "/sandboxes/"), "/")
		rt.toSandbox(w, r, route{id: id})
	case strings.HasPrefix(path, "/templates") || strings.HasPrefix(path, "/v2/templates") || strings.HasPrefix(path, "/v3/templates"):
		writeError(w, http.StatusNotImplemented, "template builds are not routed across a cluster yet: build on each node (its own address), or declare the template's pool with an AirlockPool")
	case path == "/mcp":
		writeError(w, http.StatusNotImplemented, "MCP sessions are not routed across a cluster yet: connect MCP clients to a node")
	default:
		writeError(w, http.StatusNotFound, "not found")
	}
}

func (rt *Router) authorized(r *http.Request) bool {
	key := r.Header.Get("X-API-KEY")
	if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); key == "" && ok && strings.EqualFold(scheme, "Bearer") {
		key = token
	}
	return key != "" && subtle.ConstantTimeCompare([]byte(key), []byte(rt.key)) == 1
}

// sandboxHost reads {port}-{sandboxID}.{domain} as the nodes do; an
// id that names no node is no sandbox's.
func (rt *Router) sandboxHost(host string) (port, id string, ok bool) {
	port, id, ok = sandboxid.ParseHost(host, rt.domain)
	return port, id, ok && prefixOf(id) != ""
}

// toSandbox passes r to the node of its sandbox; a sandbox whose node is
// gone (or that never was) is not found, at once.
func (rt *Router) toSandbox(w http.ResponseWriter, r *http.Request, to route) {
	n, ok := rt.nodes.byID(to.id)
	if !ok {
		writeError(w, http.StatusNotFound, "sandbox %q not found", to.id)
		return
	}
	to.node = n
	// Streams answer while their request is still read (see the node's
	// gateway): without full duplex the server would end the body.
	_ = http.NewResponseController(w).EnableFullDuplex()
	rt.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, to)))
}

// proxyError answers a request that reached no node. A node whose port
// refuses connections, or whose host is unreachable, has no daemon:
// its sandboxes are gone. Anything else (a timeout, a reset) may be
// load, and is a 502.
func (rt *Router) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	to := r.Context().Value(routeKey{}).(route)
	if nodeGone(err) {
		rt.nodes.failed(to.node.Name)
		rt.log.Warn("router: node gone", "node", to.node.Name, "err", err)
		writeError(w, http.StatusNotFound, "sandbox %q not found", to.id)
		return
	}
	if r.Context().Err() == nil {
		rt.log.Warn("router: proxy", "node", to.node.Name, "err", err)
	}
	writeError(w, http.StatusBadGateway, "the sandbox's host did not answer")
}

// nodeGone reports whether err says that nothing listens at a node's
// address: the connection was refused, or its host is unreachable.
func nodeGone(err error) bool {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// dialFailed reports whether err came before the request was sent: it
// may be sent to another node.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// rewriteDomain puts the router's domain into the sandbox descriptions
// that nodes return, so that the SDKs' getHost(port) comes back here.
func (rt *Router) rewriteDomain(resp *http.Response) error {
	if resp.StatusCode/100 != 2 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") ||
		resp.Request.Header.Get("E2b-Sandbox-Id") != "" {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		resp.Body.Close()
		return err
	}
	if len(body) > maxBody {
		// No sandbox description is this long: pass it on as it is.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
		return nil
	}
	resp.Body.Close()
	body = withDomain(body, rt.domain)
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// withDomain sets the "domain" of a JSON object that has one.
func withDomain(body []byte, domain string) []byte {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return body
	}
	if _, ok := obj["domain"]; !ok {
		return body
	}
	obj["domain"], _ = json.Marshal(domain)
	out, err := json.Marshal(obj)
	if err != nil {
		return body
	}
	return append(out, '\n')
}

// create places a new sandbox: on a node with a ready pooled sandbox of
// the template (the most ready first), else on the least loaded. A node
// that is full, shutting down, unreachable or without the template hands
// the create to the next.
func (rt *Router) create(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body over %d bytes", maxBody)
		return
	}
	var req struct {
		TemplateID string `json:"templateID"`
	}
	json.Unmarshal(body, &req) // the node names what is wrong with it
	template := req.TemplateID
	if template == "" {
		template = "base"
	}
	candidates := placement(rt.nodes.live(), template)
	if len(candidates) == 0 {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "no live Airlock node: none has registered, or every one's lease ran out")
		return
	}
	var last *http.Response
	var lastBody []byte
	for _, n := range candidates {
		// Counted from now, not from the answer: concurrent creates
		// spread rather than all pick the node that looked best.
		rt.nodes.placed(n.Name, template)
		resp, err := rt.send(r.Context(), n, r, body)
		if err != nil {
			rt.log.Warn("router: create", "node", n.Name, "err", err)
			if nodeGone(err) {
				rt.nodes.failed(n.Name)
			}
			if dialFailed(err) {
				continue // never sent: another node may take it
			}
			// Sent, perhaps made: a second create elsewhere could leave
			// one that nobody knows of.
			writeError(w, http.StatusBadGateway, "the node chosen for the sandbox did not answer")
			return
		}
		respBody, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		if err != nil {
			writeError(w, http.StatusBadGateway, "the node chosen for the sandbox did not answer")
			return
		}
		last, lastBody = resp, respBody
		if !tryNext(resp.StatusCode, respBody) {
			break
		}
	}
	if last == nil {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "no Airlock node took the sandbox: every one failed to answer")
		return
	}
	if last.StatusCode/100 == 2 {
		lastBody = withDomain(lastBody, rt.domain)
	}
	copyHeader(w.Header(), last.Header)
	w.Header().Set("Content-Length", strconv.Itoa(len(lastBody)))
	w.WriteHeader(last.StatusCode)
	w.Write(lastBody)
}

// tryNext says whether a node's answer to a create leaves it to another:
// full (429), shutting down or short of host room (503), or without the
// template, which another node may have.
func tryNext(status int, body []byte) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	case http.StatusBadRequest:
		return bytes.Contains(body, []byte("unknown template"))
	}
	return false
}

// placement orders the nodes for a create of template: those with ready
// pooled sandboxes of it first, most ready first; then by load.
func placement(nodes []node, template string) []node {
	load := func(n node) float64 {
		if n.Capacity <= 0 {
			return float64(n.Sandboxes)
		}
		return float64(n.Sandboxes) / float64(n.Capacity)
	}
	slices.SortStableFunc(nodes, func(a, b node) int {
		ra, rb := a.Ready[template], b.Ready[template]
		switch {
		case ra > 0 && rb == 0:
			return -1
		case rb > 0 && ra == 0:
			return 1
		}
		if la, lb := load(a), load(b); la != lb {
			if la < lb {
				return -1
			}
			return 1
		}
		if ra != rb {
			return rb - ra
		}
		return strings.Compare(a.Name, b.Name)
	})
	return nodes
}

// send passes r, with body, to node n and returns its answer.
func (rt *Router) send(ctx context.Context, n node, r *http.Request, body []byte) (*http.Response, error) {
	u := strings.TrimSuffix(n.Address, "/") + r.URL.RequestURI()
	out, err := http.NewRequestWithContext(ctx, r.Method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"X-API-KEY", "Authorization", "Content-Type", "Accept", "User-Agent", "E2B-Traffic-Access-Token", "X-Access-Token"} {
		if v := r.Header.Get(h); v != "" {
			out.Header.Set(h, v)
		}
	}
	return rt.client.Do(out)
}

// fanOut sends r to every live node at once and returns the answers of
// those that gave one.
func (rt *Router) fanOut(r *http.Request) []answer {
	nodes := rt.nodes.live()
	answers := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
			defer cancel()
			resp, err := rt.send(ctx, n, r, nil)
			if err != nil {
				if nodeGone(err) {
					rt.nodes.failed(n.Name)
				}
				rt.log.Warn("router: fan-out", "node", n.Name, "path", r.URL.Path, "err", err)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
			if err == nil {
				answers[i] = answer{node: n, status: resp.StatusCode, header: resp.Header, body: body}
			}
		})
	}
	wg.Wait()
	return slices.DeleteFunc(answers, func(a answer) bool { return a.status == 0 })
}

type answer struct {
	node   node
	status int
	header http.Header
	body   []byte
}

// fanOutOK is fanOut's answers if every node took the request; else it
// relays the first refusal (every node checks a request the same way, so
// one's refusal is every one's) and returns false.
func (rt *Router) fanOutOK(w http.ResponseWriter, r *http.Request) ([]answer, bool) {
	answers := rt.fanOut(r)
	for _, a := range answers {
		if a.status/100 != 2 {
			relay(w, a)
			return nil, false
		}
	}
	return answers, true
}

// list merges the nodes' lists. Their order and page tokens are the
// same on every node (start time, then id), so a page of the cluster is
// the first limit of the nodes' pages merged, and the token of its last.
func (rt *Router) list(w http.ResponseWriter, r *http.Request) {
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	type item struct {
		raw       json.RawMessage
		id        string
		startedAt time.Time
	}
	var items []item
	more := false
	for _, a := range answers {
		var page []json.RawMessage
		if err := json.Unmarshal(a.body, &page); err != nil {
			rt.log.Warn("router: list", "node", a.node.Name, "err", err)
			continue
		}
		more = more || a.header.Get("X-Next-Token") != ""
		for _, raw := range page {
			var it struct {
				SandboxID string    `json:"sandboxID"`
				StartedAt time.Time `json:"startedAt"`
			}
			json.Unmarshal(raw, &it)
			items = append(items, item{withDomain(raw, rt.domain), it.SandboxID, it.StartedAt})
		}
	}
	asc := r.URL.Query().Get("order") == "asc"
	slices.SortFunc(items, func(a, b item) int {
		c := a.startedAt.Compare(b.startedAt)
		if c == 0 {
			c = strings.Compare(a.id, b.id)
		}
		if asc {
			return c
		}
		return -c
	})
	if l, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && l > 0 && l < len(items) {
		items, more = items[:l], true
	}
	if more && len(items) > 0 {
		last := items[len(items)-1]
		w.Header().Set("X-Next-Token", strconv.FormatInt(last.startedAt.UnixNano(), 10)+"."+last.id)
	}
	out := make([]json.RawMessage, len(items))
	for i, it := range items {
		out[i] = bytes.TrimSpace(it.raw)
	}
	writeJSON(w, http.StatusOK, out)
}

// listSnapshots merges the nodes' snapshots; each lives on the node that
// took it, and a create from it finds that node (create's fallback).
func (rt *Router) listSnapshots(w http.ResponseWriter, r *http.Request) {
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	out := []json.RawMessage{}
	for _, a := range answers {
		var page []json.RawMessage
		if json.Unmarshal(a.body, &page) == nil {
			out = append(out, page...)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// pools lists every node's pools, each naming its node.
func (rt *Router) pools(w http.ResponseWriter, r *http.Request) {
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	out := []map[string]any{}
	var budget int64
	for _, a := range answers {
		var got struct {
			Pools  []map[string]any `json:"pools"`
			Budget int64            `json:"memoryBudgetBytes"`
		}
		if json.Unmarshal(a.body, &got) != nil {
			continue
		}
		for _, p := range got.Pools {
			p["node"] = a.node.Name
			out = append(out, p)
		}
		budget += got.Budget
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": out, "memoryBudgetBytes": budget})
}

// signedFile passes a signed file URL, which names no sandbox, to the
// node whose sandbox signed it: each node checks the signature against
// its own sandboxes, and only one can have made it. It is asked of each
// node in turn, so an upload's body is kept to be sent again: up to
// maxSignedUpload, and only a few at a time, for anyone can send one.
func (rt *Router) signedFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method != http.MethodGet && r.Method != http.MethodPost || !strings.HasPrefix(q.Get("signature"), "v1_") {
		writeError(w, http.StatusUnauthorized, "the file URL's signature is not valid, or it has expired")
		return
	}
	if exp := q.Get("signature_expiration"); exp != "" {
		if n, err := strconv.ParseInt(exp, 10, 64); err != nil || time.Now().Unix() > n {
			writeError(w, http.StatusUnauthorized, "the file URL's signature is not valid, or it has expired")
			return
		}
	}
	var body []byte
	if r.Method == http.MethodPost {
		select {
		case rt.uploads <- struct{}{}:
			defer func() { <-rt.uploads }()
		case <-r.Context().Done():
			return
		}
		var err error
		if body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxSignedUpload)); err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, "an upload through a signed URL to a cluster is limited to %d MiB: write larger files with files.write", maxSignedUpload>>20)
			return
		}
	}
	for _, n := range rt.nodes.live() {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, strings.TrimSuffix(n.Address, "/")+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			break
		}
		for _, h := range []string{"Content-Type", "Accept", "User-Agent"} {
			if v := r.Header.Get(h); v != "" {
				out.Header.Set(h, v)
			}
		}
		resp, err := rt.client.Do(out)
		if err != nil {
			continue
		}
		if resp.StatusCode == http.StatusUnauthorized {
			resp.Body.Close()
			continue // not this node's sandbox
		}
		defer resp.Body.Close()
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		return
	}
	writeError(w, http.StatusUnauthorized, "the file URL's signature is not valid, or it has expired")
}

// Signed uploads in a cluster: at most this large, this many at a time.
const (
	maxSignedUpload = 32 << 20
	signedUploads   = 4
)

func relay(w http.ResponseWriter, a answer) {
	copyHeader(w.Header(), a.header)
	w.WriteHeader(a.status)
	w.Write(a.body)
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		if k == "Content-Length" || k == "Connection" || k == "Transfer-Encoding" {
			continue
		}
		dst[k] = vs
	}
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]any{"code": status, "message": fmt.Sprintf(format, args...)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
