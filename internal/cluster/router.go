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
	"strconv"
	"strings"
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
	// uploads bounds the signed uploads held at once.
	uploads chan struct{}
	// templates: the AirlockTemplates that template builds through the
	// router write (builds.go), served by builds.
	templates dynamic.ResourceInterface
	builds    *http.ServeMux
	// templateUploads bounds the COPY uploads held at once.
	templateUploads chan struct{}
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
	rt := newRouter(nodes, key, domain, log)
	rt.templates = client.Resource(templatesResource).Namespace(namespace)
	return rt, nil
}

// newRouter routes over nodes, which are being watched.
func newRouter(nodes *nodeSet, key, domain string, log *slog.Logger) *Router {
	rt := &Router{key: key, domain: domain, nodes: nodes, log: log, uploads: make(chan struct{}, signedUploads)}
	rt.builds, rt.templateUploads = rt.templateRoutes(), make(chan struct{}, templateUploads)
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
	case r.Method == http.MethodPut && rt.templates != nil && isFilesPath(path):
		// Signed instead: the SDK puts a COPY's files to the URL it was
		// given, without the API key.
		id, hash := filesPath(path)
		rt.uploadFiles(w, r, id, hash)
	case strings.HasPrefix(path, "/volumecontent/"):
		// A volume's files carry its token, which its node checks.
		rt.volumeContent(w, r)
	case !rt.authorized(r):
		writeError(w, http.StatusUnauthorized, "invalid or missing API key (X-API-KEY or Authorization: Bearer)")
	case r.Method == http.MethodPost && path == "/volumes":
		rt.createVolume(w, r)
	case r.Method == http.MethodGet && path == "/volumes":
		rt.listVolumes(w, r)
	case strings.HasPrefix(path, "/volumes/"):
		rt.toVolume(w, r, strings.TrimPrefix(path, "/volumes/"))
	case r.Method == http.MethodPost && (path == "/sandboxes" || path == "/v2/sandboxes"):
		rt.create(w, r)
	case r.Method == http.MethodGet && (path == "/sandboxes" || path == "/v2/sandboxes"):
		rt.list(w, r)
	case r.Method == http.MethodGet && path == "/snapshots":
		rt.listSnapshots(w, r)
	case r.Method == http.MethodGet && path == "/sandboxes/metrics":
		rt.metricsList(w, r)
	case r.Method == http.MethodGet && path == "/airlock/pools":
		rt.pools(w, r)
	case r.Method == http.MethodGet && path == "/airlock/nodes":
		writeJSON(w, http.StatusOK, rt.nodes.live())
	case strings.HasPrefix(path, "/sandboxes/") || strings.HasPrefix(path, "/v2/sandboxes/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(path, "/v2"), "/sandboxes/"), "/")
		rt.toSandbox(w, r, route{id: id})
	case strings.HasPrefix(path, "/templates") || strings.HasPrefix(path, "/v2/templates") || strings.HasPrefix(path, "/v3/templates"):
		if _, pattern := rt.builds.Handler(r); pattern != "" && rt.templates != nil {
			rt.builds.ServeHTTP(w, r) // which sets the path's values
			return
		}
		writeError(w, http.StatusNotFound, "not found")
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
	rt.proxyTo(w, r, to)
}

// proxyTo passes r to to.node.
func (rt *Router) proxyTo(w http.ResponseWriter, r *http.Request, to route) {
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
