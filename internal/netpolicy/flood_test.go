package netpolicy

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/nettest"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// labEnv names the test that a child process runs inside the lab.
const labEnv = "AIRLOCK_NETPOLICY_IN_LAB"

// inLab reports whether the calling test runs inside a fake internet
// (package nettest). If not, it runs the test again in a child process
// that starts in the lab's host namespace, so that every thread of it,
// and every socket, interface and nftables rule it makes, is there and
// no packet can leave the machine, and reports false.
func inLab(t *testing.T) bool {
	t.Helper()
	if os.Getenv(labEnv) == t.Name() {
		return true
	}
	airlocktest.RequiresRoot(t)
	lab, err := nettest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), labEnv+"="+t.Name())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := nettest.Do(lab.Host, cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("in the lab: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	return false
}

// TestFloodLimits: a sandbox that floods its resolver and its proxy is
// cut at its rates by the host's nftables rules, before the daemon sees
// the excess; its neighbour's queries and connections all arrive. Counts,
// not times: the rates are per hour, so nothing refills during the test.
func TestFloodLimits(t *testing.T) {
	if !inLab(t) {
		return
	}
	const n, burst = 10, 20 // a bucket of n+burst packets, refilled 10 an hour
	limits := Limits{DNSRate: Rate{N: n, Per: time.Hour, Burst: burst}, ConnectionRate: Rate{N: n, Per: time.Hour, Burst: burst}}
	// No upstream and a closed policy: nothing the resolver or the proxy
	// receives goes further.
	h, err := NewHost(Config{Upstream: []string{}, Limits: limits}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	closed := policy.Network{Mode: policy.NetFiltered}
	flooder, err := h.Attach(t.Context(), "flooder", closed)
	if err != nil {
		t.Fatal(err)
	}
	defer flooder.Close()
	neighbour, err := h.Attach(t.Context(), "neighbour", closed)
	if err != nil {
		t.Fatal(err)
	}
	defer neighbour.Close()

	const flood = 300
	if got := queries(t, flooder, flood); got == 0 {
		t.Error("no query of the flood was answered")
	}
	t.Logf("the flooder's resolver received %d of %d queries", flooder.dns.queries.Load(), flood)
	if got := flooder.dns.queries.Load(); got > n+burst+1 || got == 0 {
		t.Errorf("%d of %d DNS queries reached the flooder's resolver, want 1 to %d", got, flood, n+burst+1)
	}
	connect(t, flooder, flood)
	t.Logf("the flooder's proxy accepted %d of %d connections", flooder.proxy.accepted.Load(), flood)
	if got := flooder.proxy.accepted.Load(); got > n+burst+1 || got == 0 {
		t.Errorf("%d of %d new connections reached the flooder's proxy, want 1 to %d", got, flood, n+burst+1)
	}
	// The neighbour's budget is its own.
	if got := queries(t, neighbour, n); got != n {
		t.Errorf("the neighbour had %d of %d queries answered", got, n)
	}
	connect(t, neighbour, n)
	if got := neighbour.proxy.accepted.Load(); got != n {
		t.Errorf("%d of the neighbour's %d connections reached its proxy", got, n)
	}
	// Its limits go with the sandbox.
	flooder.Close()
	neighbour.Close()
	if left, err := mappedInterfaces(); err != nil || len(left) > 0 {
		t.Errorf("left in nftables: %v, %v", left, err)
	}
}

// queries sends count DNS queries over UDP to a's resolver, from inside
// a's namespace, at once, and returns how many were answered.
func queries(t *testing.T, a *Attachment, count int) int {
	t.Helper()
	var c net.PacketConn
	if err := nettest.Do(a.Namespace(), func() (err error) { c, err = net.ListenPacket("udp4", ":0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	to := &net.UDPAddr{IP: net.IP(resolverAddr.AsSlice()), Port: 53}
	for i := range count {
		q := new(dns.Msg)
		q.SetQuestion("flood.test.", dns.TypeA)
		q.Id = uint16(i)
		b, _ := q.Pack()
		if _, err := c.WriteTo(b, to); err != nil {
			t.Fatal(err)
		}
	}
	answered := 0
	buf := make([]byte, 512)
	// A second without an answer: the rest were dropped.
	for {
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := c.ReadFrom(buf); err != nil {
			return answered
		}
		answered++
	}
}

// connect opens count TCP connections from inside a's namespace at once
// (to an address of the lab's internet, which the proxy refuses), and
// waits until a's proxy has had time to accept what arrived.
func connect(t *testing.T, a *Attachment, count int) {
	t.Helper()
	var fds []int
	err := nettest.Do(a.Namespace(), func() error {
		for range count {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			err = unix.Connect(fd, &unix.SockaddrInet4{Addr: nettest.OtherAddr.As4(), Port: nettest.BannerPort})
			if err != nil && err != unix.EINPROGRESS {
				return err
			}
		}
		return nil
	})
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	// Until the count of accepted connections holds still for a second.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	last := int64(-1)
	for ctx.Err() == nil {
		if now := a.proxy.accepted.Load(); now == last {
			return
		} else {
			last = now
		}
		time.Sleep(time.Second)
	}
}

// TestTableGainsLimits: a table made by an airlock without limits (no
// flood map, no rule looking it up) gains them once, under the next
// process's ensureTable.
func TestTableGainsLimits(t *testing.T) {
	if !inLab(t) {
		return
	}
	if err := ensureTable(); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	guard := &nftables.Chain{Name: "guard", Table: table()}
	// jumps lists the rules of guard that look up the flood map.
	jumps := func() (out []*nftables.Rule) {
		rules, err := c.GetRules(table(), guard)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok && l.SetName == mapFlood {
					out = append(out, r)
				}
			}
		}
		return out
	}
	rules := jumps()
	if len(rules) != 1 {
		t.Fatalf("a new table has %d rules jumping by the flood map, want 1", len(rules))
	}
	// Make it the table of an older airlock.
	if err := c.DelRule(rules[0]); err != nil {
		t.Fatal(err)
	}
	c.DelSet(floodMap())
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(jumps()) != 0 {
		t.Fatal("the rule is still there")
	}
	for range 2 {
		if err := ensureTable(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.GetSetByName(table(), mapFlood); err != nil {
		t.Errorf("the flood map: %v", err)
	}
	if n := len(jumps()); n != 1 {
		t.Errorf("the table has %d rules jumping by the flood map, want 1", n)
	}
}
