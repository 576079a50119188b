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
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	for in, want := range map[string]string{
		"":                    "",
		"Bearer " + key:       "",
		key:                   "",
		basic("root:" + key):  basic("root:"),
		basic("user:"):        basic("user:"),
		basic(":" + key):      "",
		"Digest username=bob": "",
	} {
		h := http.Header{}
		if in != "" {
			h.Set("Authorization", in)
		}
		agentAuthorization(h)
		if got := h.Get("Authorization"); got != want {
			t.Errorf("Authorization %q became %q, want %q", in, got, want)
		}
	}
}
