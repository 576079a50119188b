package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandboxid"
)

// The gateway: sandbox traffic, to the agent inside (envd's port and
// the code interpreter's) or to the servers that the sandbox's processes
// run on other ports.

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
	header := r.Header.Get("X-Access-Token")
	token := sb.CheckToken(header) ||
		(port != agentproto.EnvdPort && sb.CheckTrafficToken(r.Header.Get("E2B-Traffic-Access-Token")))
	signed := false
	switch {
	case token:
	case port != agentproto.EnvdPort:
		writeError(w, http.StatusUnauthorized, "invalid or missing access token for this sandbox")
		return
	case header != "":
		// A wrong token is refused, signed URL or not, as envd does.
		msg := errUnauthorized
		if r.URL.Path == agentproto.FilesPath {
			msg = errTokenMismatch
		}
		writeError(w, http.StatusUnauthorized, "%s", msg)
		return
	default:
		if no := signedFor(r, sb); no != nil {
			writeError(w, no.status, "%s", no.msg)
			return
		}
		signed = true
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
	logRequest(sb, r)
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, sb)))
}

// logRequest adds a request to the agent to sb's log, as envd logs each
// of its calls, when it is passed on: the call, never its body or query
// (a signed URL's signature is in it).
func logRequest(sb *sandbox.Sandbox, r *http.Request) {
	sb.Log("info", "gateway", callName(r.Method, r.URL.Path), "method", r.Method+" "+r.URL.Path, "port", r.Header.Get("E2b-Sandbox-Port"))
}

// callName is envd's name for a call: "Process start" for
// /process.Process/Start, the method and path for plain HTTP.
func callName(method, path string) string {
	pkg, rest, ok := strings.Cut(strings.TrimPrefix(path, "/"), ".")
	svc, m, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || pkg == "" || svc == "" || m == "" || strings.Contains(m, "/") {
		return method + " " + path
	}
	return strings.ToUpper(svc[:1]) + svc[1:] + " " + strings.ToLower(m[:1]) + m[1:]
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

// agentProxy passes requests on to the agent of the sandbox they were
// routed to (sandboxKey), without Airlock's credentials.
func (s *Server) agentProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
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
				sb := r.Context().Value(sandboxKey{}).(*sandbox.Sandbox)
				sb.Log("error", "gateway", "the sandbox's agent is not reachable", "method", r.Method+" "+r.URL.Path)
			}
			writeError(w, http.StatusBadGateway, "the sandbox's agent is not reachable")
		},
	}
}

// portProxy passes requests on to the server listening on a port
// (portKey) inside the sandbox they were routed to.
func (s *Server) portProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
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
}
