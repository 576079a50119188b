package httpapi

import (
	"crypto/subtle"
	"encoding/base64"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// What the gateway takes out of requests before they reach a sandbox,
// and of the answers of /files before they reach a browser.

// credentialHeaders carry Airlock's credentials: the API key and the
// sandbox's tokens. No server in a sandbox, the agent included, gets
// them: code there could keep and reuse them.
var credentialHeaders = []string{"X-API-KEY", "X-Access-Token", "E2B-Traffic-Access-Token"}

// agentAuthorization is what the agent may see of a request's
// Authorization: the user it names in Basic (envd's way of choosing who
// runs a command), and nothing else: no password, no bearer token (the
// API key, as MCP clients and Prometheus send it), and no user name that
// is the key or one of sb's tokens.
func (s *Server) agentAuthorization(h http.Header, sb *sandbox.Sandbox) {
	user, _, ok := (&http.Request{Header: h}).BasicAuth()
	h.Del("Authorization")
	if ok && user != "" && !s.isSecret(user, sb) {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// isSecret reports whether v is the API key or one of sb's tokens.
func (s *Server) isSecret(v string, sb *sandbox.Sandbox) bool {
	secrets := []string{s.apiKey}
	if sb != nil {
		secrets = append(secrets, sb.AccessToken, sb.TrafficToken)
	}
	for _, c := range secrets {
		if c != "" && subtle.ConstantTimeCompare([]byte(v), []byte(c)) == 1 {
			return true
		}
	}
	return false
}

// dropKeyAuthorization removes Authorization from h when it carries the
// API key or one of sb's tokens, as a bearer token, in Basic or bare;
// any other is the business of the sandbox's server and stays.
func (s *Server) dropKeyAuthorization(h http.Header, sb *sandbox.Sandbox) {
	secret := func(v string) bool { return s.isSecret(v, sb) }
	for _, v := range h.Values("Authorization") {
		scheme, cred, _ := strings.Cut(strings.TrimSpace(v), " ")
		cred = strings.TrimSpace(cred)
		user, pass, basic := (&http.Request{Header: http.Header{"Authorization": {v}}}).BasicAuth()
		if secret(v) || secret(scheme) || secret(cred) || basic && (secret(user) || secret(pass)) {
			h.Del("Authorization")
			return
		}
	}
}

// fileAnswerHeaders are the headers of an answer of /files that pass
// from the agent to the client: those that describe the bytes. Anything
// else the sandbox chose (Set-Cookie, Refresh, Clear-Site-Data, Link, a
// content type) must not reach a browser.
var fileAnswerHeaders = []string{"Content-Length", "Content-Encoding", "Content-Range", "Accept-Ranges", "Date", "Etag", "Last-Modified"}

// fileAnswer makes an answer of /files safe to show a browser. Signed
// URLs are made for browsers and are served on the API's own origin,
// where the console keeps the API key, and the answer's bytes and
// headers are the sandbox's to choose: rendered, an HTML file would run
// as the console. So it is a download that nothing renders or runs:
// attachment, a content type of ours, no sniffing, and a CSP sandbox
// (an opaque origin, no scripts) should a browser render it anyway.
func fileAnswer(resp *http.Response) {
	h := resp.Header
	ct := "application/octet-stream"
	if mt, _, err := mime.ParseMediaType(h.Get("Content-Type")); err == nil && mt == "application/json" {
		ct = "application/json" // the agent's errors and upload results, which the SDKs read
	}
	kept := http.Header{}
	for _, k := range fileAnswerHeaders {
		if v := h.Values(k); len(v) > 0 {
			kept[k] = v
		}
	}
	clear(h)
	for k, v := range kept {
		h[k] = v
	}
	h.Set("Content-Type", ct)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	if resp.Request != nil && resp.Request.Method == http.MethodGet && resp.StatusCode/100 == 2 {
		h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": downloadName(resp.Request.URL.Query().Get("path"))}))
	}
}

// downloadName is the base name of p, with every byte but letters,
// digits, '.', '-' and '_' made '_': a name no browser or shell reads
// as more than a name.
func downloadName(p string) string {
	name := []byte(strings.TrimPrefix(path.Base(path.Clean("/"+p)), "/"))
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			name[i] = '_'
		}
	}
	n := strings.Trim(string(name), ".")
	if len(n) > 128 {
		n = n[len(n)-128:]
	}
	if n == "" {
		n = "download"
	}
	return n
}
