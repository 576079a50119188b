package httpapi

import (
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// What the gateway takes out of requests before they reach a sandbox.

// credentialHeaders carry Airlock's credentials: the API key and the
// sandbox's tokens. No server in a sandbox, the agent included, gets
// them: code there could keep and reuse them.
var credentialHeaders = []string{"X-API-KEY", "X-Access-Token", "E2B-Traffic-Access-Token"}

// agentAuthorization is what the agent may see of a request's
// Authorization: the user it names in Basic (envd's way of choosing who
// runs a command), and nothing else: no password, no bearer token (the
// API key, as MCP clients and Prometheus send it).
func agentAuthorization(h http.Header) {
	user, _, ok := (&http.Request{Header: h}).BasicAuth()
	h.Del("Authorization")
	if ok && user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
}

// dropKeyAuthorization removes Authorization from h when it carries the
// API key or one of sb's tokens, as a bearer token, in Basic or bare;
// any other is the business of the sandbox's server and stays.
func (s *Server) dropKeyAuthorization(h http.Header, sb *sandbox.Sandbox) {
	secret := func(v string) bool {
		for _, c := range []string{s.apiKey, sb.AccessToken, sb.TrafficToken} {
			if c != "" && subtle.ConstantTimeCompare([]byte(v), []byte(c)) == 1 {
				return true
			}
		}
		return false
	}
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
