package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Signed file URLs, the SDK's downloadUrl and uploadUrl: /files with
// ?signature=v1_…[&signature_expiration=UNIX], for a browser or any
// other process that has neither the sandbox's token nor headers to send.
// E2B's scheme: "v1_" and the unpadded base64 of
// sha256("path:operation:user:accessToken[:expiration]"), the operation
// "read" for GET and "write" for POST. Only the sandbox's access token
// makes one, and it covers that path, operation and user alone.

// signedFor reports whether r is a /files request that a signature of
// sb's access token opens, unexpired.
func signedFor(r *http.Request, sb *sandbox.Sandbox) bool {
	if r.URL.Path != agentproto.FilesPath {
		return false
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if !strings.HasPrefix(sig, "v1_") {
		return false
	}
	var op string
	switch r.Method {
	case http.MethodGet:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return false
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + sb.AccessToken
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return false
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// signedSandbox finds the sandbox whose access token signed r, a signed
// URL of E2B_SANDBOX_URL, which names no sandbox: the signature itself
// does, as only one sandbox's token can have made it.
func (s *Server) signedSandbox(r *http.Request) *sandbox.Sandbox {
	for _, sb := range s.m.List(nil) {
		if signedFor(r, sb) {
			return sb
		}
	}
	return nil
}
