// Package nettest builds a fake internet for network tests: two network
// namespaces of the test's own, a "host" for the daemon and an "internet"
// with DNS, HTTP, TLS and TCP servers on addresses the test chose. The
// internet namespace has no uplink and no default route: no packet of a
// test can leave the machine.
package nettest

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
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The lab's addresses. The internet's are documentation ranges
// (RFC 5737), which the sandbox policy treats as public; the private and
// metadata hosts are there to be refused.
var (
	HostAddr     = netip.MustParseAddr("203.0.113.2")  // the daemon's host, on the internet
	InternetGW   = netip.MustParseAddr("203.0.113.1")  // the internet's end of the host's uplink
	DNSAddr      = netip.MustParseAddr("203.0.113.53") // the internet's DNS server
	AllowedAddr  = netip.MustParseAddr("203.0.113.10") // allowed.test
	DeniedAddr   = netip.MustParseAddr("203.0.113.20") // denied.test
	OtherAddr    = netip.MustParseAddr("203.0.113.30") // other.test
	CIDRAddr     = netip.MustParseAddr("198.51.100.7") // a host allowed by address only
	PackagesAddr = netip.MustParseAddr("203.0.113.40") // packages.test: apt, pip and npm (packages.go)
	PrivateAddr  = netip.MustParseAddr("10.99.0.5")    // a private-range host; rebind.test points here
	MetadataAddr = netip.MustParseAddr("169.254.169.254")
)

// Ports the internet's servers listen on, on every address it has.
const (
	HTTPPort   = 80
	HTTPSPort  = 443
	BannerPort = 7000 // a TCP server that writes one line and closes
	// SOCKSPort is a SOCKS5 proxy (RFC 1928) that wants SOCKSUser and
	// SOCKSPassword (RFC 1929) and connects to what it is asked.
	SOCKSPort = 1080
)

// The lab SOCKS5 proxy's credentials.
const (
	SOCKSUser     = "lab"
	SOCKSPassword = "lab-pass"
)

// Names the internet's DNS answers; every other name is NXDOMAIN.
var Names = map[string]netip.Addr{
	"allowed.test":     AllowedAddr,
	"www.allowed.test": AllowedAddr,
	"denied.test":      DeniedAddr,
	"other.test":       OtherAddr,
	"rebind.test":      PrivateAddr,
	"packages.test":    PackagesAddr,
}

// Aliases are names the internet's DNS answers with a CNAME to another
// name, and that name's address if it is one of Names: cluster-alias.test
// points into a Kubernetes cluster's zone, as a public name may.
var Aliases = map[string]string{"alias.test": "denied.test", "cluster-alias.test": "db.default.svc.cluster.local"}

// Lab is a running fake internet.
type Lab struct {
	Host     *os.File // the host namespace: run the daemon in it (Start, Do)
	Internet *os.File
	CAFile   string // PEM of the CA that signed the TLS servers' certificates
	CAPEM    []byte

	// DNSLog is a file of every name the internet's DNS server was asked,
	// one a line with its type ("A x.test"): what a sandbox's lookups
	// carried out of the host, for exfiltration tests.
	DNSLog string
	// HTTPLog is a file of every request the web servers answered, one
	// JSON object a line: {"host", "path", "tls", "authorization"}, what
	// arrived, for tests of what the egress proxy sent on.
	HTTPLog string
	httpLog sync.Mutex

	dir     string
	closers []io.Closer
	wg      sync.WaitGroup
}

// New builds the lab. It needs root; dir holds the CA file.
func New(dir string) (l *Lab, err error) {
	l = &Lab{dir: dir}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if l.Host, err = newNetns(); err != nil {
		return l, err
	}
	if l.Internet, err = newNetns(); err != nil {
		return l, err
	}
	if err := l.wire(); err != nil {
		return l, err
	}
	if err := l.startServers(); err != nil {
		return l, err
	}
	return l, nil
}

// Close stops the servers and lets the namespaces go.
func (l *Lab) Close() error {
	for _, c := range l.closers {
		c.Close()
	}
	l.wg.Wait()
	for _, f := range []*os.File{l.Host, l.Internet} {
		if f != nil {
			f.Close()
		}
	}
	return nil
}

// Do runs f on a thread inside ns: sockets it creates stay in ns, and a
// process it starts (exec.Cmd.Start) runs in ns.
func Do(ns *os.File, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, err) // the thread stays locked, and goes
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func newNetns() (*os.File, error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	defer self.Close()
	var ns *os.File
	err = Do(self, func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("new network namespace: %w", err)
		}
		var err error
		ns, err = os.Open("/proc/thread-self/ns/net")
		return err
	})
	return ns, err
}

// wire connects host and internet with a veth pair and numbers them.
func (l *Lab) wire() error {
	h, err := netlink.NewHandleAt(netns.NsHandle(int(l.Host.Fd())))
	if err != nil {
		return err
	}
	defer h.Close()
	in, err := netlink.NewHandleAt(netns.NsHandle(int(l.Internet.Fd())))
	if err != nil {
		return err
	}
	defer in.Close()
	la := netlink.NewLinkAttrs()
	la.Name = "uplink"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "uplink", PeerNamespace: netlink.NsFd(int(l.Internet.Fd()))}); err != nil {
		return fmt.Errorf("lab veth: %w", err)
	}
	up := func(h *netlink.Handle, name string, addrs ...string) (netlink.Link, error) {
		link, err := h.LinkByName(name)
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			na, err := netlink.ParseAddr(a)
			if err != nil {
				return nil, err
			}
			if err := h.AddrAdd(link, na); err != nil {
				return nil, fmt.Errorf("%s %s: %w", name, a, err)
			}
		}
		return link, h.LinkSetUp(link)
	}
	if _, err := up(h, "lo"); err != nil {
		return err
	}
	uplink, err := up(h, "uplink", HostAddr.String()+"/24")
	if err != nil {
		return err
	}
	// The host's only way out is the fake internet.
	if err := h.RouteAdd(&netlink.Route{LinkIndex: uplink.Attrs().Index, Gw: net.IP(InternetGW.AsSlice())}); err != nil {
		return fmt.Errorf("host default route: %w", err)
	}
	var extra []string
	for _, a := range []netip.Addr{DNSAddr, AllowedAddr, DeniedAddr, OtherAddr, CIDRAddr, PrivateAddr, MetadataAddr, PackagesAddr} {
		extra = append(extra, a.String()+"/32")
	}
	if _, err := up(in, "lo", extra...); err != nil {
		return err
	}
	// No default route in the internet: it answers what it is sent, and
	// its /24 reaches the host.
	_, err = up(in, "uplink", InternetGW.String()+"/24")
	return err
}

// startServers starts the internet's DNS, HTTP, TLS and banner servers.
func (l *Lab) startServers() error {
	ca, certs, err := makeCerts()
	if err != nil {
		return err
	}
	l.CAPEM = ca
	l.HTTPLog = l.dir + "/http-requests.log"
	if err := os.WriteFile(l.HTTPLog, nil, 0o644); err != nil {
		return err
	}
	l.CAFile = l.dir + "/lab-ca.pem"
	if err := os.WriteFile(l.CAFile, ca, 0o644); err != nil {
		return err
	}
	var httpLn, tlsLn, bannerLn, socksLn net.Listener
	var dnsPC net.PacketConn
	var dnsLn net.Listener
	err = Do(l.Internet, func() error {
		var err error
		if httpLn, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", HTTPPort)); err != nil {
			return err
		}
		l.closers = append(l.closers, httpLn)
		if tlsLn, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", HTTPSPort)); err != nil {
			return err
		}
		l.closers = append(l.closers, tlsLn)
		if socksLn, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", SOCKSPort)); err != nil {
			return err
		}
		l.closers = append(l.closers, socksLn)
		if bannerLn, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", BannerPort)); err != nil {
			return err
		}
		l.closers = append(l.closers, bannerLn)
		if dnsPC, err = net.ListenPacket("udp4", DNSAddr.String()+":53"); err != nil {
			return err
		}
		l.closers = append(l.closers, dnsPC)
		if dnsLn, err = net.Listen("tcp4", DNSAddr.String()+":53"); err != nil {
			return err
		}
		l.closers = append(l.closers, dnsLn)
		return nil
	})
	if err != nil {
		return fmt.Errorf("lab servers: %w", err)
	}
	pkgs, err := packages(l.dir)
	if err != nil {
		return fmt.Errorf("lab package servers: %w", err)
	}
	l.serveWeb(httpLn, tlsLn, bannerLn, certs, pkgs)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		serveSOCKS(socksLn, func(dst netip.AddrPort) (net.Conn, error) {
			var c net.Conn
			err := Do(l.Internet, func() (err error) {
				c, err = net.DialTimeout("tcp4", dst.String(), 5*time.Second)
				return err
			})
			return c, err
		})
	}()
	return l.serveDNS(dnsPC, dnsLn)
}

// serveWeb serves the lab's HTTP, HTTPS and banner servers on their
// listeners until the lab closes.
func (l *Lab) serveWeb(httpLn, tlsLn, bannerLn net.Listener, certs []tls.Certificate, pkgs http.Handler) {
	// Every answer says which address it came from and for which name;
	// /bytes?n=N answers N bytes, for throughput; /headers the request's
	// headers, as JSON. packages.test is the package servers'.
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.logRequest(r)
		if r.URL.Path == "/headers" {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(r.Header)
			return
		}
		if host, _, err := net.SplitHostPort(r.Host); err == nil && host == "packages.test" || r.Host == "packages.test" {
			pkgs.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == "/bytes" {
			n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			io.CopyN(w, zeros{}, n)
			return
		}
		local := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		host, _, _ := net.SplitHostPort(local.String())
		fmt.Fprintf(w, "hello from %s for %s\n", host, r.Host)
	})
	for _, srv := range []struct {
		ln  net.Listener
		tls bool
	}{{httpLn, false}, {tlsLn, true}} {
		s := &http.Server{Handler: hello, ReadHeaderTimeout: 5 * time.Second}
		ln := srv.ln
		if srv.tls {
			ln = tls.NewListener(ln, &tls.Config{Certificates: certs})
		}
		l.closers = append(l.closers, s)
		l.wg.Add(1)
		go func() { defer l.wg.Done(); s.Serve(ln) }()
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			c, err := bannerLn.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "banner from %s\n", c.LocalAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
}

// logRequest writes r down in HTTPLog.
func (l *Lab) logRequest(r *http.Request) {
	from, _, _ := net.SplitHostPort(r.RemoteAddr)
	line, _ := json.Marshal(map[string]any{"host": r.Host, "path": r.URL.Path, "tls": r.TLS != nil,
		"authorization": r.Header.Get("Authorization"), "from": from})
	l.httpLog.Lock()
	defer l.httpLog.Unlock()
	f, err := os.OpenFile(l.HTTPLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	f.Write(append(line, '\n'))
	f.Close()
}

// serveDNS serves the lab's DNS server over UDP and TCP, writing down
// every name it is asked (DNSLog), until the lab closes.
func (l *Lab) serveDNS(dnsPC net.PacketConn, dnsLn net.Listener) error {
	l.DNSLog = l.dir + "/dns-queries.log"
	dnsLog, err := os.OpenFile(l.DNSLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	l.closers = append(l.closers, dnsLog)
	var logMu sync.Mutex
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		logMu.Lock()
		for _, qq := range q.Question {
			fmt.Fprintf(dnsLog, "%s %s\n", dns.TypeToString[qq.Qtype], strings.TrimSuffix(strings.ToLower(qq.Name), "."))
		}
		logMu.Unlock()
		resp := new(dns.Msg)
		resp.SetReply(q)
		resp.Authoritative = true
		if len(q.Question) == 1 {
			name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
			if target, ok := Aliases[name]; ok && q.Question[0].Qtype == dns.TypeA {
				resp.Answer = append(resp.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 5}, Target: target + "."})
				name = target
			}
			a, ok := Names[name]
			switch {
			case !ok:
				resp.Rcode = dns.RcodeNameError
			case q.Question[0].Qtype == dns.TypeA:
				resp.Answer = append(resp.Answer, &dns.A{Hdr: dns.RR_Header{Name: name + ".", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: a.AsSlice()})
			}
		}
		w.WriteMsg(resp)
	})
	for _, s := range []*dns.Server{{PacketConn: dnsPC, Handler: handler}, {Listener: dnsLn, Handler: handler}} {
		l.closers = append(l.closers, closerFunc(s.Shutdown))
		l.wg.Add(1)
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go func() { defer l.wg.Done(); s.ActivateAndServe() }()
		<-started
	}
	return nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// makeCerts makes a CA and one certificate, signed by it, for every name
// of Names.
func makeCerts() (caPEM []byte, certs []tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Airlock test lab CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	var names []string
	for n := range Names {
		names = append(names, n)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "lab"}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		[]tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, nil
}

// DialContext connects from the lab's host namespace: a client of a
// daemon that runs there (an http.Transport's DialContext).
func (l *Lab) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := Do(l.Host, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a TCP listener at addr in ns that counts the connections
// it accepts, for showing that a sandbox cannot reach it.
func Listen(ns *os.File, addr string) (*Counter, error) {
	var ln net.Listener
	if err := Do(ns, func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		return nil, err
	}
	c := &Counter{ln: ln}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			conn.Close()
		}
	}()
	return c, nil
}

// Counter is a listener that counts connections.
type Counter struct {
	ln net.Listener
	n  atomic.Int64
}

// Accepted is how many connections arrived.
func (c *Counter) Accepted() int64 { return c.n.Load() }

// Close stops the listener.
func (c *Counter) Close() error { return c.ln.Close() }
