package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCert writes a CA's certificate for names, and its key, to dir and
// returns their paths and the CA's pool.
func testCert(t *testing.T, dir string, names ...string) (cert, key string, roots *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(ca)
	return cert, key, roots
}

// With a wildcard domain and its certificate, the daemon answers as E2B
// does: the API at https://api.DOMAIN, a sandbox's servers at
// https://PORT-ID.DOMAIN (what getHost(port) gives), checked against the
// certificate by a client that trusts its CA.
func TestServeHTTPSOnADomain(t *testing.T) {
	dir := t.TempDir()
	cert, key, roots := testCert(t, dir, "airlock.test", "*.airlock.test")
	cfg := resolve(t, `{"network": {"disabled": true}}`, nil, "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state"),
		"--backend", "fake", "--pool-size", "0", "--domain", "airlock.test", "--tls-cert", cert, "--tls-key", key)
	d := serve(t, cfg, fakes(t, "fake"))
	if !strings.HasPrefix(d.URL(), "https://") {
		t.Errorf("URL %s, want https", d.URL())
	}
	// Every name is this daemon's: what DNS would say of the domain.
	addr := d.ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
	t.Cleanup(client.CloseIdleConnections)
	do := func(method, url, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-KEY", d.Key().Value)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := do("GET", "https://api.airlock.test/health", ""); code != 200 || body != "ok\n" {
		t.Errorf("health at api.airlock.test: %d %q", code, body)
	}
	code, body := do("POST", "https://api.airlock.test/v2/sandboxes", `{"templateID": "base"}`)
	var sb struct {
		SandboxID string `json:"sandboxID"`
		Domain    string `json:"domain"`
	}
	if err := json.Unmarshal([]byte(body), &sb); code != http.StatusCreated || err != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	if sb.Domain != "airlock.test" {
		t.Errorf("domain %q, want airlock.test", sb.Domain)
	}
	// No server listens on the port: the gateway says so, which it does
	// only for a sandbox's host.
	if code, body := do("GET", "https://8000-"+sb.SandboxID+".airlock.test/", ""); code != http.StatusBadGateway || !strings.Contains(body, "port 8000") {
		t.Errorf("getHost(8000) over https: %d %q, want the gateway's 502", code, body)
	}
	// A client that does not trust the CA is refused by its own check.
	_, err := http.Get(d.URL() + "/health")
	if ue := (*tls.CertificateVerificationError)(nil); !errors.As(err, &ue) {
		t.Errorf("a client without the CA: %v, want a certificate error", err)
	}
}

func TestTLSRefusals(t *testing.T) {
	dir := t.TempDir()
	cert, key, _ := testCert(t, dir, "other.test", "*.other.test")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no key", []string{"--domain", "airlock.test", "--tls-cert", cert}, "tls needs both cert and key"},
		{"no domain", []string{"--tls-cert", cert, "--tls-key", key}, "tls needs a domain"},
		{"another domain's", []string{"--domain", "airlock.test:8443", "--tls-cert", cert, "--tls-key", key}, "does not cover *.airlock.test"},
		{"not a certificate", []string{"--domain", "airlock.test", "--tls-cert", key, "--tls-key", key}, "tls: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--listen", "127.0.0.1:0", "--state-dir", filepath.Join(t.TempDir(), "state"), "--backend", "fake"}, tc.args...)
			_, err := New(t.Context(), resolve(t, `{"network": {"disabled": true}}`, nil, args...), Options{Log: testLog(t), Backends: fakes(t, "fake")})
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("New: %T %v, want a one-line *ConfigError naming %q", err, err, tc.want)
			}
		})
	}
}

func TestNSSResolvesLocalhost(t *testing.T) {
	for conf, want := range map[string]bool{
		"hosts: files dns\n": false,
		"passwd: files\nhosts:          files mdns4_minimal [NOTFOUND=return] dns\n": false,
		"hosts: files myhostname dns\n":                                              true,
		"hosts: mymachines resolve [!UNAVAIL=return] files\n":                        true,
		"# hosts: myhostname\n":                                                      false,
	} {
		p := filepath.Join(t.TempDir(), "nsswitch.conf")
		if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := nssResolvesLocalhost(p); got != want {
			t.Errorf("%q: %v, want %v", conf, got, want)
		}
	}
	if nssResolvesLocalhost(filepath.Join(t.TempDir(), "none")) {
		t.Error("no nsswitch.conf: true, want false")
	}
}
