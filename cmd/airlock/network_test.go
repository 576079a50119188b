package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/airlocktest"
	"github.com/airlock-sandbox/airlock/internal/nettest"
)

// newLab builds the fake internet (package nettest) for one test.
func newLab(t *testing.T) *nettest.Lab {
	t.Helper()
	airlocktest.RequiresRoot(t)
	lab, err := nettest.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	return lab
}

// airlockIn runs airlock in the lab's host namespace.
func airlockIn(t *testing.T, lab *nettest.Lab, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(airlockBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := nettest.Do(lab.Host, cmd.Start); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	return cliResult{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// leftovers lists the sandbox veth pairs and nftables map elements in the
// lab's host namespace, once the kernel has had time to delete the
// namespaces of sandboxes that ended (it does so in the background).
func leftovers(t *testing.T, lab *nettest.Lab) []string {
	t.Helper()
	left := leftoversNow(t, lab)
	for deadline := time.Now().Add(10 * time.Second); len(left) > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		left = leftoversNow(t, lab)
	}
	return left
}

func leftoversNow(t *testing.T, lab *nettest.Lab) []string {
	t.Helper()
	var left []string
	h, err := netlink.NewHandleAt(netns.NsHandle(int(lab.Host.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "al-") {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(lab.Host.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"proxy", "dns_udp", "dns_tcp", "tcp_in", "udp_in", "flood"} {
		set, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: "airlock_v1"}, m)
		if err != nil {
			continue // no table yet
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range elems {
			left = append(left, m+" "+strings.TrimRight(string(e.Key), "\x00"))
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if strings.HasPrefix(ch.Name, "flood-al-") {
			left = append(left, "chain "+ch.Name)
		}
	}
	return left
}

// hasTable says whether the lab's host namespace holds airlock's table,
// which a server or a run deletes as it ends if no sandbox on the host
// has a network.
func hasTable(t *testing.T, lab *nettest.Lab) bool {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(lab.Host.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListTableOfFamily("airlock_v1", nftables.TableFamilyINet)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		t.Fatal(err)
	}
	return err == nil
}

const netProbe = `
import socket, sys
for name, port in [("allowed.test", 80), ("denied.test", 80), ("203.0.113.20", 7000), ("198.51.100.7", 7000), ("10.99.0.5", 80)]:
    try:
        s = socket.create_connection((name, port), timeout=5)
        s.sendall(b"GET / HTTP/1.0\r\nHost: " + name.encode() + b"\r\n\r\n")
        data = s.recv(100)
        print(name, "ok" if data else "closed")
    except Exception as e:
        print(name, "refused")
`

// netCases are netProbe's results under each network of airlock run's
// flags (none: loopback only).
var netCases = []struct {
	flags []string
	want  string
}{
	{[]string{"--net", "internet"}, "allowed.test ok|denied.test ok|203.0.113.20 ok|198.51.100.7 ok|10.99.0.5 refused"},
	{[]string{"--allow-out", "allowed.test", "--allow-out", "198.51.100.0/24"},
		"allowed.test ok|denied.test refused|203.0.113.20 refused|198.51.100.7 ok|10.99.0.5 refused"},
	{[]string{"--net", "internet", "--deny-out", "denied.test", "--deny-out", "203.0.113.0/24"},
		"allowed.test refused|denied.test refused|203.0.113.20 refused|198.51.100.7 ok|10.99.0.5 refused"},
	{nil, "allowed.test refused|denied.test refused|203.0.113.20 refused|198.51.100.7 refused|10.99.0.5 refused"},
}

func TestRunNetwork(t *testing.T) {
	lab := newLab(t)
	dns := nettest.DNSAddr.String()
	for _, backend := range []string{"namespaces", "gvisor"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "gvisor" && os.Getenv("AIRLOCK_RUNSC") == "" {
				if _, err := exec.LookPath("runsc"); err != nil {
					t.Skip("no runsc (make test builds it)")
				}
			}
			for _, tc := range netCases {
				args := append([]string{"run", "--backend", backend, "--dns", dns}, tc.flags...)
				if len(tc.flags) == 0 {
					args = []string{"run", "--backend", backend}
				}
				r := airlockIn(t, lab, append(args, "--code", netProbe)...)
				if got := strings.ReplaceAll(strings.TrimSpace(r.stdout), "\n", "|"); r.code != 0 || got != tc.want {
					t.Errorf("%v: exit %d, got %s, want %s; stderr %s", tc.flags, r.code, got, tc.want, r.stderr)
				}
				if left := leftovers(t, lab); len(left) > 0 {
					t.Errorf("%v left %v", tc.flags, left)
				}
				if hasTable(t, lab) {
					t.Errorf("%v left the host's nftables table", tc.flags)
				}
			}
		})
	}
}

// A killed daemon's sandbox networks: the namespaces and veth pairs die
// with the sandboxes, the map entries and chains of limits stay until
// the next start removes them; on both backends.
func TestServeNetworkCrashRecovery(t *testing.T) {
	lab := newLab(t)
	for _, backend := range []string{"namespaces", "gvisor"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "gvisor" && os.Getenv("AIRLOCK_RUNSC") == "" {
				if _, err := exec.LookPath("runsc"); err != nil {
					t.Skip("no runsc (make test builds it)")
				}
			}
			dir := t.TempDir()
			cfg := dir + "/config.json"
			os.WriteFile(cfg, []byte(`{"network": {"dns": ["`+nettest.DNSAddr.String()+`"]}}`), 0o644)
			args := []string{"--config", cfg, "--pool-size", "0", "--backend", backend}
			s := startServeIn(t, lab, dir+"/state", args...)
			code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"allow_internet_access": true}, map[string]string{"X-API-KEY": s.key})
			if code != 201 {
				t.Fatalf("create: %d %s", code, body)
			}
			var c created
			json.Unmarshal(body, &c)
			if out := s.run(t, c, "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://allowed.test/\").read().decode())'"); !strings.Contains(out, "for allowed.test") {
				t.Fatalf("the sandbox's network does not work: %q", out)
			}
			if left := leftoversNow(t, lab); len(left) != 9 {
				t.Fatalf("a networked sandbox holds %v, want a link, four map elements, three set elements and a chain", left)
			}
			s.cmd.Process.Kill()
			s.cmd.Wait()
			// What the killed daemon left (gVisor's mounts among it) only
			// a start on its state directory removes: if the test fails
			// before its own, one more is made for that.
			restarted := false
			t.Cleanup(func() {
				if !restarted {
					startServeIn(t, lab, dir+"/state", args...).stop(t)
				}
			})
			for deadline := time.Now().Add(10 * time.Second); len(airlocktest.SandboxProcs()) > 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("sandbox processes outlived the daemon: %v", airlocktest.SandboxProcs())
				}
			}
			s2 := startServeIn(t, lab, dir+"/state", args...)
			restarted = true
			if left := leftovers(t, lab); len(left) > 0 {
				t.Errorf("after the restart: %v", left)
			}
			s2.stop(t)
			if hasTable(t, lab) {
				t.Error("the host's nftables table outlived the last server")
			}
		})
	}
}

// A sandbox's connections and bandwidth are bounded (the server's
// network.connections and network.bandwidth).
func TestServeNetworkLimits(t *testing.T) {
	lab := newLab(t)
	dir := t.TempDir()
	cfg := dir + "/config.json"
	os.WriteFile(cfg, []byte(`{"network": {"dns": ["`+nettest.DNSAddr.String()+`"], "connections": 4, "bandwidth": "256K"}}`), 0o644)
	s := startServeIn(t, lab, dir+"/state", "--config", cfg, "--pool-size", "0")
	defer s.stop(t)
	code, body := s.do(t, "POST", "/v2/sandboxes", map[string]any{"allow_internet_access": true}, map[string]string{"X-API-KEY": s.key})
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var c created
	json.Unmarshal(body, &c)
	// Four connections stay open; the fifth is reset.
	out := s.run(t, c, `python3 -c '
import socket
held = [socket.create_connection(("203.0.113.10", 80), timeout=5) for _ in range(4)]
try:
    # The reset may come before connect returns, or after.
    s = socket.create_connection(("203.0.113.10", 80), timeout=5)
    s.settimeout(5)
    print("fifth:", len(s.recv(10)), "bytes")
except Exception as e:
    print("fifth:", type(e).__name__)
held[0].sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
print("first:", held[0].recv(200).split(b"\r\n")[0].decode())
' 2>&1`)
	if !strings.Contains(out, "fifth: ConnectionResetError") && !strings.Contains(out, "fifth: 0 bytes") || !strings.Contains(out, "first: HTTP/1.0 200 OK") {
		t.Errorf("connection limit: %s", out)
	}
	// The client times its own download: what arrived is bounded by the
	// rate over that time, plus one burst, however fast the machine.
	out = s.run(t, c, `python3 -c '
import socket, time
s = socket.create_connection(("203.0.113.10", 80), timeout=10)
s.sendall(b"GET /bytes?n=4000000 HTTP/1.0\r\nHost: x\r\n\r\n")
start, n = time.monotonic(), 0
while time.monotonic() - start < 1.5:
    s.settimeout(max(0.01, 1.5 - (time.monotonic() - start)))
    try:
        b = s.recv(65536)
    except socket.timeout:
        break
    if not b:
        break
    n += len(b)
print(n, time.monotonic() - start)
'`)
	var got int64
	var secs float64
	if _, err := fmt.Sscan(out, &got, &secs); err != nil {
		t.Fatalf("download: %q", out)
	}
	if limit := int64(256<<10*secs) + 64<<10; got > limit || got == 0 {
		t.Errorf("%d bytes in %.2fs at 256 KiB/s: want at most %d, and some", got, secs, limit)
	}
}
