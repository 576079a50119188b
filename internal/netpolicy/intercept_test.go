package netpolicy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// TestInterceptFillsSecrets: TLS to a host with rules is terminated with
// a certificate of the host's CA; each request goes on over TLS verified
// against the roots, with the rule's header set in place of the
// sandbox's own, its secret filled in, and the secret masked wherever
// the answer repeats it. A request for another host on the connection is
// refused, and a rule whose secret is gone fails closed.
func TestInterceptFillsSecrets(t *testing.T) {
	const secret = "sk-live-0123456789abcdef"
	web := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		switch r.URL.Path {
		case "/gzip": // compresses whatever it was asked
			w.Header().Set("Content-Encoding", "gzip")
			io.WriteString(w, auth)
			return
		case "/trailer": // echoes in a 103's header and a trailer
			w.Header().Set("Link", auth)
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			w.Header().Set("Trailer", "X-Echo")
			io.WriteString(w, "body")
			w.Header().Set("X-Echo", auth)
			return
		}
		w.Header().Set("X-Echo", auth)
		io.WriteString(w, r.Host+" got "+auth+" encoding "+r.Header.Get("Accept-Encoding")+" range "+r.Header.Get("Range"))
	}))
	defer web.Close()
	roots := x509.NewCertPool()
	roots.AddCert(web.Certificate())
	ca, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{"key": secret}
	at := lab(t, policy.Network{Mode: policy.NetInternet, Rules: map[string][]policy.Transform{
		"example.com": {{Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.key}"}}},
	}})
	at.host = &Host{ca: ca, roots: roots, secrets: func(name string) (string, error) {
		if v, ok := secrets[name]; ok {
			return v, nil
		}
		return "", errors.New("no such secret")
	}}
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AppendCertsFromPEM(ca.PEM())
	dst := netip.MustParseAddrPort(strings.TrimPrefix(web.URL, "https://"))
	var getAt func(dst netip.AddrPort, host, path, extra string) (*http.Response, string)
	var early string // the Link of the last 1xx answer
	// get sends a request for host on a new intercepted connection, with
	// a forged Authorization of the sandbox's own.
	get := func(host string) (*http.Response, string) {
		t.Helper()
		return getAt(dst, host, "/", "")
	}
	getAt = func(dst netip.AddrPort, host, path, extra string) (*http.Response, string) {
		t.Helper()
		client, in := tcpPair(t)
		r := &relay{in: in, dst: dst, name: "example.com"}
		if !at.proxy.track(r) {
			t.Fatal("not tracked")
		}
		go func() {
			defer at.proxy.wg.Done()
			defer at.proxy.untrack(r)
			at.proxy.intercept(r, nil)
		}()
		tc := tls.Client(client, &tls.Config{ServerName: "example.com", RootCAs: sandboxRoots})
		if err := tc.Handshake(); err != nil {
			t.Fatalf("the sandbox does not trust the proxy's certificate: %v", err)
		}
		if issuer := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; !strings.HasPrefix(issuer, "Airlock egress CA") {
			t.Errorf("certificate issued by %q", issuer)
		}
		io.WriteString(tc, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\nAuthorization: Bearer forged\r\nAccept-Encoding: gzip\r\nRange: bytes=0-7\r\n"+extra+"\r\n")
		br := bufio.NewReader(tc)
		resp, err := http.ReadResponse(br, nil)
		for err == nil && resp.StatusCode < 200 {
			early = resp.Header.Get("Link")
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatalf("GET %s: %v", host, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	resp, body := get("example.com")
	masked := "Bearer " + strings.Repeat("*", len(secret))
	if resp.StatusCode != http.StatusOK || body != "example.com got "+masked+" encoding  range " {
		t.Errorf("through the rule: %d %q", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-Echo"); got != masked {
		t.Errorf("the answer's header repeats the secret as %q", got)
	}
	// The sandbox names the rule's header as hop-by-hop: it is set anyway.
	if _, body := getAt(dst, "example.com", "/", "Connection: Authorization\r\n"); body != "example.com got "+masked+" encoding  range " {
		t.Errorf("a rule's header stripped by the sandbox's Connection: %q", body)
	}
	// An answer compressed anyway cannot be searched: refused.
	if resp, body := getAt(dst, "example.com", "/gzip", ""); resp.StatusCode != http.StatusBadGateway || strings.Contains(body, secret) {
		t.Errorf("a compressed answer: %d %q", resp.StatusCode, body)
	}
	// 1xx headers and trailers are masked too.
	if resp, body := getAt(dst, "example.com", "/trailer", ""); body != "body" || resp.Trailer.Get("X-Echo") != masked || early != masked {
		t.Errorf("1xx and trailer: %d %q, trailer %q, 103's Link %q", resp.StatusCode, body, resp.Trailer.Get("X-Echo"), early)
	}
	// The sandbox sends the rule's name to a server of its choosing,
	// which cannot prove to be it: the request never reaches it.
	var reached bool
	evil := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	other, err := LoadCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := other.leaf("example.com")
	if err != nil {
		t.Fatal(err)
	}
	evil.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	evil.StartTLS()
	defer evil.Close()
	if resp, _ := getAt(netip.MustParseAddrPort(strings.TrimPrefix(evil.URL, "https://")), "example.com", "/", ""); resp.StatusCode != http.StatusBadGateway || reached {
		t.Errorf("a server that is not the rule's host: %d, reached %v", resp.StatusCode, reached)
	}
	if resp, _ := get("other.example"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a request for another host on the connection: %d", resp.StatusCode)
	}
	delete(secrets, "key") // gone: the request is refused, not sent without it
	if resp, body := get("example.com"); resp.StatusCode != http.StatusForbidden || strings.Contains(body, "Bearer") {
		t.Errorf("a rule whose secret is gone: %d %q", resp.StatusCode, body)
	}
}

// TestMaskOverlapping: two secrets that overlap are both masked whole.
func TestMaskOverlapping(t *testing.T) {
	b := []byte("abcXdef")
	mask(b, [][]byte{[]byte("abcX"), []byte("Xdef")})
	if string(b) != "*******" {
		t.Errorf("masked %q", b)
	}
}

// TestMaskerAcrossReads: a secret split across reads of the body is
// masked whole, and nothing else changes.
func TestMaskerAcrossReads(t *testing.T) {
	body := "a SECRET b SECRETSECRET c SECRE"
	m := newMasker(io.NopCloser(iotest.OneByteReader(strings.NewReader(body))), [][]byte{[]byte("SECRET")})
	got, err := io.ReadAll(m)
	if err != nil || string(got) != "a ****** b ************ c SECRE" {
		t.Errorf("masked %q, %v", got, err)
	}
}
