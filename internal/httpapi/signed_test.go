package httpapi

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// sign is the SDK's getSignature.
func sign(path, op, user, token string, exp int64) url.Values {
	raw := path + ":" + op + ":" + user + ":" + token
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
		q.Set("signature_expiration", strconv.FormatInt(exp, 10))
	}
	sum := sha256.Sum256([]byte(raw))
	q.Set("signature", "v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
	return q
}

func TestSignedFileURLs(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c, other := a.create(nil), a.create(nil)
	soon := time.Now().Add(time.Minute).Unix()
	get := func(q url.Values, method string, hdr http.Header) int {
		code, _, _ := a.do(method, "/files?"+q.Encode(), nil, hdr)
		return code
	}
	good := sign("/home/user/f", "read", "", c.EnvdAccessToken, soon)
	// Without a sandbox named, the signature finds its sandbox; the fake
	// agent then answers for the file (404: there is none).
	if code := get(good, "GET", nil); code != http.StatusNotFound {
		t.Errorf("a good signature: %d, want the agent's 404 for a file that is not there", code)
	}
	for name, q := range map[string]url.Values{
		"another path": func() url.Values {
			q := sign("/home/user/f", "read", "", c.EnvdAccessToken, soon)
			q.Set("path", "/etc/shadow")
			return q
		}(),
		"another user": func() url.Values {
			q := sign("/home/user/f", "read", "", c.EnvdAccessToken, soon)
			q.Set("username", "root")
			return q
		}(),
		"expired": sign("/home/user/f", "read", "", c.EnvdAccessToken, time.Now().Add(-time.Second).Unix()),
		"a later expiry": func() url.Values {
			q := sign("/home/user/f", "read", "", c.EnvdAccessToken, soon)
			q.Set("signature_expiration", strconv.FormatInt(soon+3600, 10))
			return q
		}(),
		"no token": sign("/home/user/f", "read", "", "", soon),
		"not v1":   url.Values{"path": {"/home/user/f"}, "signature": {"v2_x"}},
	} {
		if code := get(q, "GET", nil); code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, code)
		}
	}
	if code := get(good, "POST", nil); code != http.StatusUnauthorized {
		t.Errorf("a read signature used to write: %d, want 401", code)
	}
	// Naming a sandbox, only its own token's signatures open it.
	hdr := http.Header{"E2b-Sandbox-Id": {other.SandboxID}, "E2b-Sandbox-Port": {"49983"}}
	if code := get(good, "GET", hdr); code != http.StatusUnauthorized {
		t.Errorf("a signature of another sandbox's token: %d, want 401", code)
	}
	hdr.Set("E2b-Sandbox-Id", c.SandboxID)
	if code := get(good, "GET", hdr); code != http.StatusNotFound {
		t.Errorf("its own signature, naming it: %d, want the agent's 404", code)
	}
}

// TestSignedURLRefusals: a refused /files request gets envd's status and
// body, word for word, whether it names its sandbox or its signature
// finds it (E2B_SANDBOX_URL); so does a wrong token on envd's port.
func TestSignedURLRefusals(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	soon, past := time.Now().Add(time.Minute).Unix(), time.Now().Add(-time.Minute).Unix()
	named := http.Header{"E2b-Sandbox-Id": {c.SandboxID}, "E2b-Sandbox-Port": {"49983"}}
	with := func(h http.Header, k, v string) http.Header {
		h = h.Clone()
		h.Set(k, v)
		return h
	}
	tampered := sign("/home/user/f", "read", "", c.EnvdAccessToken, soon)
	tampered.Set("path", "/home/user/g")
	badExpiry := sign("/home/user/f", "read", "", c.EnvdAccessToken, soon)
	badExpiry.Set("signature_expiration", "soon")
	for _, tc := range []struct {
		name, method, path string
		hdr                http.Header
		code               int
		msg                string
	}{
		{"expired, by its signature", "GET", "/files?" + sign("/home/user/f", "read", "", c.EnvdAccessToken, past).Encode(), nil, 401, errExpiredSignature},
		{"expired, named", "GET", "/files?" + sign("/home/user/f", "read", "", c.EnvdAccessToken, past).Encode(), named, 401, errExpiredSignature},
		{"tampered, by its signature", "GET", "/files?" + tampered.Encode(), nil, 401, errInvalidSignature},
		{"tampered, named", "GET", "/files?" + tampered.Encode(), named, 401, errInvalidSignature},
		{"another token's, expired", "GET", "/files?" + sign("/home/user/f", "read", "", "other", past).Encode(), named, 401, errInvalidSignature},
		{"not v1", "GET", "/files?path=/home/user/f&signature=v2_x", nil, 401, errInvalidSignature},
		{"a read signature to write", "POST", "/files?" + sign("/home/user/f", "read", "", c.EnvdAccessToken, soon).Encode(), named, 401, errInvalidSignature},
		{"no signature", "GET", "/files?path=/home/user/f", named, 401, errMissingSignature},
		{"an unreadable expiry", "GET", "/files?" + badExpiry.Encode(), named, 400, "Invalid format for parameter signature_expiration: want a Unix time in seconds"},
		{"a wrong token with a good signature", "GET", "/files?" + sign("/home/user/f", "read", "", c.EnvdAccessToken, soon).Encode(), with(named, "X-Access-Token", "wrong"), 401, errTokenMismatch},
		{"a wrong token elsewhere", "POST", "/process.Process/List", with(named, "X-Access-Token", "wrong"), 401, errUnauthorized},
		{"no token elsewhere", "POST", "/process.Process/List", named, 401, errUnauthorized},
	} {
		code, _, data := a.do(tc.method, tc.path, "", tc.hdr)
		if code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.name, code, data, tc.code)
			continue
		}
		if msg := apiError(t, tc.code, data); msg != tc.msg {
			t.Errorf("%s: %q, want envd's %q", tc.name, msg, tc.msg)
		}
	}
}

// TestSignedURLActsAsItsUser: the user a URL was signed for is the user
// it acts as; an Authorization header naming another is dropped.
func TestSignedURLActsAsItsUser(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	home := strings.TrimSpace(a.run(c, "pwd; printf mine > f"))
	q := sign(home+"/f", "read", "user", c.EnvdAccessToken, 0)
	root := http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("root:"))}}
	code, _, data := a.do("GET", "/files?"+q.Encode(), nil, root)
	if code != http.StatusOK || string(data) != "mine" {
		t.Errorf("a URL signed for user, with Basic root: %d %s, want the file as user", code, data)
	}
}

// TestFileAnswersCannotScript: what a sandbox serves as a file reaches a
// browser, on the API's origin, as a download that nothing renders.
func TestFileAnswersCannotScript(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	home := strings.TrimSpace(a.run(c, `pwd; printf '<script>alert(localStorage)</script>' > '"page; x=.html'`))
	name := home + `/"page; x=.html`
	check := func(how string, code int, h http.Header, data []byte) {
		t.Helper()
		if code != http.StatusOK || !strings.Contains(string(data), "<script>") {
			t.Fatalf("%s: %d %s", how, code, data)
		}
		want := map[string]string{
			"Content-Type":            "application/octet-stream",
			"Content-Disposition":     `attachment; filename=_page__x_.html`,
			"X-Content-Type-Options":  "nosniff",
			"Content-Security-Policy": "sandbox; default-src 'none'",
		}
		for k, v := range want {
			if got := h.Get(k); got != v {
				t.Errorf("%s: %s %q, want %q", how, k, got, v)
			}
		}
	}
	q := sign(name, "read", "", c.EnvdAccessToken, 0)
	code, h, data := a.do("GET", "/files?"+q.Encode(), nil, nil)
	check("signed", code, h, data)
	code, h, data = a.do("GET", "/files?"+url.Values{"path": {name}}.Encode(), nil, http.Header{"E2b-Sandbox-Id": {c.SandboxID}, "E2b-Sandbox-Port": {"49983"}, "X-Access-Token": {c.EnvdAccessToken}})
	check("with the token", code, h, data)
	// An error stays JSON, for the SDKs, and is not rendered either.
	q = sign(home+"/none", "read", "", c.EnvdAccessToken, 0)
	code, h, _ = a.do("GET", "/files?"+q.Encode(), nil, nil)
	if code != http.StatusNotFound || h.Get("Content-Type") != "application/json" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Content-Security-Policy") == "" {
		t.Errorf("a missing file: %d %v", code, h)
	}
}

func TestDownloadName(t *testing.T) {
	for in, want := range map[string]string{
		"/home/user/report.csv":  "report.csv",
		"/home/user/a b\"c;d":    "a_b_c_d",
		"/home/user/":            "user",
		"/":                      "download",
		"":                       "download",
		"../../..":               "download",
		"/x/\r\nSet-Cookie: a=b": "__Set-Cookie__a_b",
		"/x/..hidden":            "hidden",
		"/x/naïve.txt":           "na__ve.txt",
	} {
		if got := downloadName(in); got != want {
			t.Errorf("downloadName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAgentAuthorization(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	sb, _ := a.m.Get(c.SandboxID)
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	for in, want := range map[string]string{
		"":                          "",
		"Bearer " + key:             "",
		key:                         "",
		basic("root:" + key):        basic("root:"),
		basic("user:"):              basic("user:"),
		basic(":" + key):            "",
		basic(key + ":"):            "",
		basic(sb.AccessToken + ":"): "",
		"Digest username=bob":       "",
	} {
		h := http.Header{}
		if in != "" {
			h.Set("Authorization", in)
		}
		a.s.agentAuthorization(h, sb)
		if got := h.Get("Authorization"); got != want {
			t.Errorf("Authorization %q became %q, want %q", in, got, want)
		}
	}
}

// TestSignedURLsRateLimited: a client may try only so many signed URLs
// that name no sandbox (each costs a hash per sandbox); then 429 with
// Retry-After. A URL that names its sandbox costs one hash and passes.
func TestSignedURLsRateLimited(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	a.s.signedLimits = newClientLimits(rate.Every(time.Hour), 3, maxClients)
	c := a.create(nil)
	bad := sign("/home/user/f", "read", "", "guess", 0)
	for i := range 3 {
		if code, _, data := a.do("GET", "/files?"+bad.Encode(), nil, nil); code != http.StatusUnauthorized {
			t.Fatalf("try %d: %d %s, want 401", i, code, data)
		}
	}
	good := sign("/home/user/f", "read", "", c.EnvdAccessToken, 0)
	code, h, data := a.do("GET", "/files?"+good.Encode(), nil, nil)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" {
		t.Errorf("past the limit: %d %v %s, want 429 with Retry-After", code, h, data)
	}
	apiError(t, code, data)
	hdr := http.Header{"E2b-Sandbox-Id": {c.SandboxID}, "E2b-Sandbox-Port": {"49983"}}
	if code, _, data := a.do("GET", "/files?"+good.Encode(), nil, hdr); code != http.StatusNotFound {
		t.Errorf("naming its sandbox: %d %s, want the agent's 404", code, data)
	}
}

func TestClientLimits(t *testing.T) {
	l := newClientLimits(rate.Every(time.Hour), 1, 100)
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"192.0.2.1:1000", true},
		{"192.0.2.1:2000", false}, // the same address, another port
		{"[::ffff:192.0.2.1]:3000", false},
		{"192.0.2.2:1000", true},
		{"[2001:db8::1]:1", true},
		{"[2001:db8::ffff:1]:1", false}, // the same /64
		{"[2001:db8:0:1::1]:1", true},
		{"not an address", false},
	} {
		if got := l.allow(tc.addr); got != tc.want {
			t.Errorf("allow(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// TestClientLimitsBounded: past the clients it remembers, new addresses
// share one bucket rather than each getting a fresh one.
func TestClientLimitsBounded(t *testing.T) {
	l := newClientLimits(rate.Every(time.Hour), 1, 2)
	for _, addr := range []string{"192.0.2.1:1", "192.0.2.2:1"} {
		if !l.allow(addr) {
			t.Fatalf("%s refused", addr)
		}
	}
	if !l.allow("192.0.2.3:1") {
		t.Errorf("the first client past the bound: refused, want the shared bucket's one try")
	}
	if l.allow("192.0.2.4:1") {
		t.Errorf("a second client past the bound: allowed, want the shared bucket empty")
	}
	if len(l.clients) > 2 {
		t.Errorf("%d clients remembered, want at most 2", len(l.clients))
	}
}
