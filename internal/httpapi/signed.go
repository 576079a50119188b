package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"hash"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

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

// envd's refusals, word for word: E2B's users and SDKs see these bodies
// ({code: 401, message}) when a /files request is not let through.
const (
	errMissingSignature = "missing signature query parameter"
	errInvalidSignature = "invalid signature"
	errExpiredSignature = "signature is already expired"
	errTokenMismatch    = "access token present in header but does not match"
	errUnauthorized     = "unauthorized access, please provide a valid access token or method signing if supported"
)

// signedRequest is what a signed request asks, checked for everything
// but the signature itself, which needs a sandbox's token.
type signedRequest struct {
	sig []byte
	// prefix is the hash of "path:operation:user:", what comes before
	// the token; suffix what comes after it.
	prefix hash.Hash
	suffix string
	// expired: its expiry has passed. envd says so only of a signature
	// that its sandbox's token made, so it is told after the hash.
	expired bool
}

// refusal is an answer that lets a request no further.
type refusal struct {
	status int
	msg    string
}

// Bounds of what a signed request may name: Linux's PATH_MAX, and a
// user name's longest in practice. Longer is refused before anything is
// hashed.
const (
	maxSignedPath = 4096
	maxSignedUser = 256
)

// parseSigned reads r as a signed /files request; a refusal, envd's, is
// for one that no signature can open (another path or method, no
// signature, a malformed one).
func parseSigned(r *http.Request) (req signedRequest, no *refusal) {
	if r.URL.Path != agentproto.FilesPath {
		return req, &refusal{http.StatusUnauthorized, errUnauthorized}
	}
	var op string
	switch r.Method {
	case http.MethodGet:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return req, &refusal{http.StatusUnauthorized, errUnauthorized}
	}
	q := r.URL.Query()
	if !q.Has("signature") {
		return req, &refusal{http.StatusUnauthorized, errMissingSignature}
	}
	sig := q.Get("signature")
	path, user := q.Get("path"), q.Get("username")
	// "v1_" and 43 characters: the unpadded base64 of 32 bytes.
	if !strings.HasPrefix(sig, "v1_") || len(sig) != 3+base64.RawStdEncoding.EncodedLen(sha256.Size) ||
		len(path) > maxSignedPath || len(user) > maxSignedUser {
		return req, &refusal{http.StatusUnauthorized, errInvalidSignature}
	}
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return req, &refusal{http.StatusBadRequest, "Invalid format for parameter signature_expiration: want a Unix time in seconds"}
		}
		req.expired = time.Now().Unix() > n
		req.suffix = ":" + exp
	}
	req.sig = []byte(sig)
	req.prefix = sha256.New()
	req.prefix.Write([]byte(path + ":" + op + ":" + user + ":"))
	return req, nil
}

// check is envd's answer to req for a sandbox's token: nil when the
// token made its signature and it has not expired.
func (req signedRequest) check(token string) *refusal {
	if !req.signedBy(token) {
		return &refusal{http.StatusUnauthorized, errInvalidSignature}
	}
	if req.expired {
		return &refusal{http.StatusUnauthorized, errExpiredSignature}
	}
	return nil
}

// signedBy reports whether token made the request's signature: one
// sha256 of what follows the prefix, from the prefix's state, and a
// comparison in constant time.
func (req signedRequest) signedBy(token string) bool {
	if token == "" {
		return false
	}
	var h hash.Hash
	if c, ok := req.prefix.(hash.Cloner); ok {
		if h2, err := c.Clone(); err == nil {
			h = h2
		}
	}
	if h == nil { // a hash that cannot be cloned (FIPS 140 mode)
		return false
	}
	h.Write([]byte(token + req.suffix))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(h.Sum(nil))
	return subtle.ConstantTimeCompare(req.sig, []byte(want)) == 1
}

// signedFor is envd's answer to r, a request to sb's agent without its
// access token: nil for a /files request that a signature of sb's token
// opens, unexpired.
func signedFor(r *http.Request, sb *sandbox.Sandbox) *refusal {
	req, no := parseSigned(r)
	if no != nil {
		return no
	}
	return req.check(sb.AccessToken)
}

// signedSandbox finds the sandbox whose access token signed r, a signed
// URL of E2B_SANDBOX_URL, which names no sandbox: the signature itself
// does, as only one sandbox's token can have made it. That is one hash
// per sandbox for a request anyone can send, so it is refused early
// when it cannot be a signature, and each client may try only so many
// (signedLimits); a request that names its sandbox (by host or header)
// costs one hash and is not limited. An expired signature of a sandbox
// is refused as expired, as envd does.
func (s *Server) signedSandbox(r *http.Request) (*sandbox.Sandbox, *refusal) {
	req, no := parseSigned(r)
	if no != nil {
		return nil, no
	}
	for _, sb := range s.m.All() {
		if req.signedBy(sb.AccessToken) {
			if no := req.check(sb.AccessToken); no != nil {
				return nil, no
			}
			return sb, nil
		}
	}
	return nil, &refusal{http.StatusUnauthorized, errInvalidSignature}
}

// Signed URLs that name no sandbox, per client: 20 a second, 100 at
// once. A browser's downloads stay far below; a client trying
// signatures is slowed to what costs the daemon little.
const (
	signedRate  = 20
	signedBurst = 100
	// maxClients bounds the clients remembered.
	maxClients = 10000
)

// clientLimits are token buckets per client address.
type clientLimits struct {
	rate  rate.Limit
	burst int
	max   int

	mu      sync.Mutex
	clients map[netip.Prefix]*rate.Limiter
	// overflow is the one bucket of every client beyond max, while the
	// remembered ones are all busy: many addresses buy no more tries.
	overflow *rate.Limiter
}

func newClientLimits(r rate.Limit, burst, max int) *clientLimits {
	return &clientLimits{rate: r, burst: burst, max: max, clients: map[netip.Prefix]*rate.Limiter{},
		overflow: rate.NewLimiter(r, burst)}
}

// allow reports whether the client at remoteAddr (host:port) may go on.
// An IPv6 client is its /64: one host commonly has a whole /64 to pick
// addresses from.
func (l *clientLimits) allow(remoteAddr string) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return false
	}
	addr := ap.Addr().Unmap()
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	client, _ := addr.Prefix(bits)
	l.mu.Lock()
	defer l.mu.Unlock()
	lim, ok := l.clients[client]
	if !ok {
		if len(l.clients) >= l.max {
			// Forget the clients whose bucket is full again: they are
			// as new ones.
			now := time.Now()
			for c, old := range l.clients {
				if old.TokensAt(now) >= float64(l.burst) {
					delete(l.clients, c)
				}
			}
		}
		if len(l.clients) >= l.max {
			return l.overflow.Allow()
		}
		lim = rate.NewLimiter(l.rate, l.burst)
		l.clients[client] = lim
	}
	return lim.Allow()
}
