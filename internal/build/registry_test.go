package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/nettest"
)

// The rule, address by address, for a host whose own addresses are
// public ones (IPv4 and IPv6), a private one and loopback.
func TestPullRuleAllows(t *testing.T) {
	own := func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("203.0.113.2"), netip.MustParseAddr("10.0.0.5"),
			netip.MustParseAddr("2001:db9::2"), netip.MustParseAddr("127.0.0.1")}, nil
	}
	var (
		public  = PullRule{}
		private = PullRule{Private: true}
		listed  = PullRule{Private: true, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"),
			netip.MustParsePrefix("203.0.113.2/32"), netip.MustParsePrefix("169.254.169.254/32")}}
	)
	for _, tc := range []struct {
		addr                    string
		public, private, listed bool
	}{
		{"203.0.113.10", true, true, true},   // another host on the internet
		{"2001:db9::10", true, true, true},   // the same in IPv6
		{"203.0.113.2", false, false, true},  // the host's own public address
		{"2001:db9::2", false, false, false}, // the same in IPv6
		{"10.0.0.5", false, false, false},    // the host's own private address
		{"10.0.0.6", false, true, true},      // a host of its network
		{"fd12::1", false, true, true},       // the same, unique-local
		{"127.0.0.1", false, false, true},    // loopback
		{"127.0.0.2", false, false, false},   // loopback, not listed
		{"::1", false, false, false},         // loopback in IPv6
		{"::ffff:127.0.0.1", false, false, true},
		{"64:ff9b::7f00:1", false, false, false}, // loopback, through NAT64
		{"0.0.0.0", false, false, false},         // connects to the host
		{"::", false, false, false},              // the same in IPv6
		{"169.254.169.254", false, false, true},  // metadata, link-local
		{"fd00:ec2::254", false, false, false},   // metadata, unique-local
		{"fe80::1", false, false, false},
		{"fe80::1%eth0", false, false, false},
		{"100.100.100.200", false, false, false}, // metadata, carrier-grade NAT
		{"224.0.0.1", false, false, false},
	} {
		a := netip.MustParseAddr(tc.addr)
		for _, c := range []struct {
			rule PullRule
			want bool
			what string
		}{{public, tc.public, "by default"}, {private, tc.private, "with private registries"}, {listed, tc.listed, "with addresses listed"}} {
			if got := c.rule.allows(a, own); got != c.want {
				t.Errorf("%s %s: allowed %v, want %v", tc.addr, c.what, got, c.want)
			}
		}
	}
	broken := func() ([]netip.Addr, error) { return nil, errors.New("no netlink") }
	if public.allows(netip.MustParseAddr("203.0.113.10"), broken) {
		t.Error("allowed with the host's addresses unknown")
	}
}

// Pulls from registries on loopback: refused unless listed, even with
// private registries allowed; a redirect or a token realm to a name that
// resolves to an address not listed is refused too, naming it, in one
// line. (go-containerregistry refuses such redirects and realms itself
// when they give an IP address, not when they give a name: the dialer's
// check is what holds.)
func TestPullFromLoopback(t *testing.T) {
	handler := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	// The registry at ::1 sends the blobs under redirect/ to the same
	// registry at localhost (127.0.0.1); the one at guarded asks for a
	// token from localhost.
	other := listen(t, "127.0.0.1", handler)
	main := listen(t, "[::1]", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v2/redirect/") && strings.Contains(r.URL.Path, "/blobs/") {
			http.Redirect(w, r, "http://localhost:"+port(other)+strings.Replace(r.URL.Path, "/v2/redirect/", "/v2/plain/", 1), http.StatusTemporaryRedirect)
			return
		}
		r.URL.Path = strings.Replace(r.URL.Path, "/v2/redirect/", "/v2/plain/", 1)
		handler.ServeHTTP(w, r)
	}))
	tokens := listen(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"token":"t"}`)
	}))
	guarded := listen(t, "[::1]", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="http://localhost:`+port(tokens)+`/token",service="test"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	ref := main + "/plain/img:1"
	tag, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	// No layers: unpacking one keeps its owners, which needs root; the
	// configuration is a blob, fetched (and redirected) as layers are.
	img, err := random.Image(512, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()

	pull := func(rule PullRule, ref string) error {
		store, err := image.Open(t.TempDir(), image.DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		b := &Builder{Store: store, Registries: rule.Transport()}
		got, err := b.base(t.Context(), &Request{FromImage: ref}, func(string, string) {})
		if err == nil && got.Digest != want.String() {
			t.Fatalf("pulled %s, want %s", got.Digest, want)
		}
		return err
	}
	refused := func(err error, registry string) bool {
		var re *RefusedError
		return errors.As(err, &re) && re.Registry == registry && err.Error() == re.Error() && !strings.Contains(err.Error(), "\n")
	}
	only := func(prefixes ...string) PullRule {
		r := PullRule{}
		for _, p := range prefixes {
			r.Allow = append(r.Allow, netip.MustParsePrefix(p))
		}
		return r
	}
	local := "localhost:" + port(other)
	for _, tc := range []struct {
		what    string
		rule    PullRule
		ref     string
		refused string // "": pulled
	}{
		{"from loopback", PullRule{}, ref, main},
		{"from loopback with private registries allowed", PullRule{Private: true}, ref, main},
		{"from a name for loopback", PullRule{}, local + "/plain/img:1", local},
		{"from a listed registry", only("::1/128"), ref, ""},
		{"redirected to a name for an address not listed", only("::1/128"), main + "/redirect/img:1", local},
		{"redirected to a listed address", only("::1/128", "127.0.0.1/32"), main + "/redirect/img:1", ""},
		{"whose token realm is an address not listed", only("::1/128"), guarded + "/plain/img:1", "localhost:" + port(tokens)},
	} {
		err := pull(tc.rule, tc.ref)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("a pull %s: %v", tc.what, err)
		case tc.refused != "" && !refused(err, tc.refused):
			t.Errorf("a pull %s: %v, want it refused naming %s", tc.what, err, tc.refused)
		}
	}
}

func port(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}

// listen serves h on a loopback address of its own and returns its
// host:port.
func listen(t *testing.T, addr string, h http.Handler) string {
	ln, err := net.Listen("tcp", addr+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

// On a host with a public address (the lab's host namespace), a pull
// never dials that address, though it is on the internet; it dials
// another host of the internet; with private registries allowed, a host
// of a private range but not the metadata service. Each dial is made in
// the lab's host namespace, through the transport's own dialer.
func TestPullRefusesHostAddress(t *testing.T) {
	airlocktest.RequiresRoot(t)
	lab, err := nettest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	var own net.Listener
	if err := nettest.Do(lab.Host, func() (err error) {
		own, err = net.Listen("tcp4", nettest.HostAddr.String()+":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	go func() {
		for {
			c, err := own.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	web := func(a netip.Addr) string { return fmt.Sprintf("%s:%d", a, nettest.HTTPPort) }
	for _, tc := range []struct {
		rule PullRule
		addr string
		ok   bool
	}{
		{PullRule{}, own.Addr().String(), false},
		{PullRule{Private: true}, own.Addr().String(), false},
		{PullRule{Allow: []netip.Prefix{netip.PrefixFrom(nettest.HostAddr, 32)}}, own.Addr().String(), true},
		{PullRule{}, web(nettest.AllowedAddr), true},
		{PullRule{}, web(nettest.PrivateAddr), false},
		{PullRule{Private: true}, web(nettest.PrivateAddr), true},
		{PullRule{Private: true}, web(nettest.MetadataAddr), false},
	} {
		dial := tc.rule.Transport().(*http.Transport).DialContext
		err := nettest.Do(lab.Host, func() error {
			c, err := dial(context.Background(), "tcp", tc.addr)
			if err == nil {
				c.Close()
			}
			return err
		})
		var re *RefusedError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%+v: dial %s: %v, want a connection", tc.rule, tc.addr, err)
		case !tc.ok && !errors.As(err, &re):
			t.Errorf("%+v: dial %s: %v, want it refused", tc.rule, tc.addr, err)
		case !tc.ok && re.Registry != tc.addr:
			t.Errorf("%+v: dial %s: refused naming %q", tc.rule, tc.addr, re.Registry)
		}
	}
}
