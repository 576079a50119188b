package netpolicy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CA is the certificate authority the egress proxy issues certificates
// from when it terminates a sandbox's TLS to a host with request rules
// (intercept.go). Sandboxes with a network trust it (their system store,
// and the variables Python's requests and Node read); its key never
// leaves the daemon.
//
// One CA serves every sandbox of a host, not one per sandbox: a
// sandbox's trust store travels with its files and memory through pause,
// snapshot, fork and live restore, and a CA made per sandbox would have
// to follow it through each (a Node process reads its extra CAs once, at
// start). What a per-sandbox CA would add, that no other sandbox's
// proxy could present a certificate it trusts, holds anyway: only the
// daemon holds the key, and each sandbox's connections reach only its
// own proxy.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	pem     []byte
	leafKey *ecdsa.PrivateKey // one key for every leaf, as issuing is on a connection's path

	mu    sync.Mutex
	leafs map[string]*tls.Certificate
}

// The CA's and its certificates' lifetimes. A leaf lives a week and is
// made anew after a day; it is issued from an hour before now, for
// clocks a little behind.
const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 7 * 24 * time.Hour
	leafRenew    = 24 * time.Hour
	maxLeafs     = 4096
)

// LoadCA reads the CA of dir (ca.pem and ca.key), making it on the first
// start. dir must be the daemon's own: the key is written 0600 and read
// only from a regular file owned by this process's user.
func LoadCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca.key")
	certPEM, cerr := os.ReadFile(certFile)
	keyPEM, kerr := readPrivate(keyFile)
	if errors.Is(cerr, os.ErrNotExist) && errors.Is(kerr, os.ErrNotExist) {
		var err error
		if certPEM, keyPEM, err = newCA(); err != nil {
			return nil, err
		}
		// The key first: a cert without its key is an error at the next
		// start, never a CA trusted with no key to match.
		if err := writeNew(keyFile, keyPEM, 0o600); err != nil {
			return nil, err
		}
		if err := writeNew(certFile, certPEM, 0o644); err != nil {
			return nil, err
		}
	} else if cerr != nil || kerr != nil {
		return nil, fmt.Errorf("egress CA in %s: %w", dir, errors.Join(cerr, kerr))
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("egress CA in %s: %w", dir, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("egress CA in %s: not an ECDSA key", dir)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: certPEM, leafKey: leafKey, leafs: map[string]*tls.Certificate{}}, nil
}

// PEM is the CA's certificate, for the sandboxes' trust stores.
func (c *CA) PEM() []byte { return c.pem }

// newCA makes a CA: a P-256 key and a self-signed certificate whose name
// carries a random tag, so that two hosts' CAs are told apart.
func newCA() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tag := make([]byte, 4)
	rand.Read(tag)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Airlock egress CA " + hex.EncodeToString(tag), Organization: []string{"Airlock"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// leaf returns a certificate for name, issued by c.
func (c *CA) leaf(name string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leafs[name]; ok && time.Since(l.Leaf.NotBefore) < leafRenew+time.Hour {
		return l, nil
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if len(c.leafs) >= maxLeafs {
		clear(c.leafs) // names a sandbox chose: bounded, made again when asked
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: c.leafKey, Leaf: leaf}
	c.leafs[name] = l
	return l, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// readPrivate reads a key file, which must be a regular file that only
// its owner may read.
func readPrivate(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 || !ok || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("%s must be a regular file of this process's user that only it can read", path)
	}
	return io.ReadAll(f)
}

// writeNew writes a file that must not exist yet, synced.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
