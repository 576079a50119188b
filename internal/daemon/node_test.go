package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/config"
)

// TestMain runs the test binary as a fake cluster binary when a test
// starts it so (fakeNode), and the tests otherwise.
func TestMain(m *testing.M) {
	if mode := os.Getenv("AIRLOCK_TEST_NODE"); mode != "" {
		os.Exit(fakeNode(mode))
	}
	os.Exit(m.Run())
}

// fakeNode is a node's registration as the tests need it: it reports its
// start (arguments and key) on the FIFO $AIRLOCK_TEST_NODE_REPORT, then
// registers and waits for SIGTERM ("register"), registers and fails at
// once ("crash"), or fails without a word ("refuse").
func fakeNode(mode string) int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	report, err := os.OpenFile(os.Getenv("AIRLOCK_TEST_NODE_REPORT"), os.O_WRONLY, 0)
	if err != nil {
		return 10
	}
	fmt.Fprintf(report, "start key=%s %s\n", os.Getenv("AIRLOCK_API_KEY"), strings.Join(os.Args[2:], " "))
	if mode == "refuse" {
		return 3
	}
	ready := os.NewFile(3, "ready")
	fmt.Fprint(ready, "registered\n")
	ready.Close()
	if mode == "crash" {
		return 4
	}
	<-term
	fmt.Fprintln(report, "left")
	return 0
}

// fakeNodes makes nodeAgents start fakeNode in the modes given, one per
// start (the last for any start beyond), and reads what they report.
type fakeNodes struct {
	modes  []string
	starts atomic.Int32
	fifo   string
	report *bufio.Scanner
}

func newFakeNodes(t *testing.T, modes ...string) *fakeNodes {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "report")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Read and write: open at once, and never at the end of its data
	// while the test holds it.
	f, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &fakeNodes{modes: modes, fifo: fifo, report: bufio.NewScanner(f)}
}

func (n *fakeNodes) command(args ...string) (*exec.Cmd, error) {
	i := min(int(n.starts.Add(1))-1, len(n.modes)-1)
	// -test.run=^$: should the mode not reach it, it runs no test.
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), "AIRLOCK_TEST_NODE="+n.modes[i], "AIRLOCK_TEST_NODE_REPORT="+n.fifo)
	return cmd, nil
}

// next is the next line a fake node reported.
func (n *fakeNodes) next(t *testing.T) string {
	t.Helper()
	if !n.report.Scan() {
		t.Fatalf("the fake nodes' report ended: %v", n.report.Err())
	}
	return n.report.Text()
}

func (n *fakeNodes) agent(t *testing.T) *nodeAgent {
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	return &nodeAgent{args: []string{"node", "--node-name", "n1"}, key: "e2b_k", log: log,
		command: n.command, retry: 0, done: make(chan struct{})}
}

// TestJoinCluster: the node joins once its registration says so, with
// the key in its environment, and leaving ends the registration.
func TestJoinCluster(t *testing.T) {
	nodes := newFakeNodes(t, "register")
	leave, err := nodes.agent(t).join()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := nodes.next(t), "start key=e2b_k node --node-name n1"; got != want {
		t.Errorf("the registration started as %q, want %q", got, want)
	}
	leave()
	if got := nodes.next(t); got != "left" {
		t.Errorf("after leave the registration reported %q, want left", got)
	}
}

// TestJoinClusterRefused: a registration that ends without registering
// fails the join, with its exit status.
func TestJoinClusterRefused(t *testing.T) {
	nodes := newFakeNodes(t, "refuse")
	_, err := nodes.agent(t).join()
	if err == nil || !strings.Contains(err.Error(), "the node could not join the cluster: exit status 3") {
		t.Errorf("join with a refused registration: %v, want the node could not join", err)
	}
}

// TestJoinClusterRestarts: a registration that ends after the node
// joined is started again, and leave ends the one that runs then.
func TestJoinClusterRestarts(t *testing.T) {
	nodes := newFakeNodes(t, "crash", "register")
	leave, err := nodes.agent(t).join()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := nodes.next(t); !strings.HasPrefix(got, "start ") {
			t.Fatalf("report %d: %q, want a start", i, got)
		}
	}
	leave()
	if got := nodes.next(t); got != "left" {
		t.Errorf("after leave the second registration reported %q, want left", got)
	}
	if n := nodes.starts.Load(); n != 2 {
		t.Errorf("%d registrations started, want 2", n)
	}
}

func TestNodeArgs(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tc := range []struct {
		name string
		node config.Node
		addr net.Addr
		want []string // present in order
		err  string
	}{
		{name: "listen address advertised", node: config.Node{Name: "n1"}, addr: tcp("127.0.0.1:4000"),
			want: []string{"node", "--node-name", "n1", "--advertise", "http://127.0.0.1:4000", "--local", "http://127.0.0.1:4000",
				"--capacity", "7", "--backends", "gvisor,namespaces", "--ready-fd", "3"}},
		{name: "advertise given", node: config.Node{Name: "n1", Advertise: "http://10.0.0.5:49982"}, addr: tcp("0.0.0.0:4000"),
			want: []string{"--advertise", "http://10.0.0.5:49982", "--local", "http://127.0.0.1:4000"}},
		{name: "cluster flags", node: config.Node{Name: "n1", Kubeconfig: "/k", Namespace: "ns"}, addr: tcp("127.0.0.1:4000"),
			want: []string{"--kubeconfig", "/k", "--namespace", "ns"}},
		{name: "nothing to advertise", node: config.Node{Name: "n1"}, addr: tcp("0.0.0.0:4000"), err: "routers cannot dial: give --advertise"},
		{name: "not TCP", node: config.Node{Name: "n1"}, addr: &net.UnixAddr{Name: "/x", Net: "unix"}, err: "cannot join from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, err := nodeArgs(tc.node, tc.addr, []string{"gvisor", "namespaces"}, 7)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error naming %q", args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !inOrder(args, tc.want) {
				t.Errorf("args %q, want %q among them", args, tc.want)
			}
		})
	}
	// Advertising nothing routers can dial is the operator's to fix.
	_, err := nodeArgs(config.Node{Name: "n1"}, tcp("0.0.0.0:1"), nil, 0)
	if ce := (*ConfigError)(nil); !errors.As(err, &ce) {
		t.Errorf("an unspecified listen address: %T %v, want a *ConfigError", err, err)
	}
}

// inOrder reports whether want is a contiguous run of args.
func inOrder(args, want []string) bool {
	for i := range args {
		if len(args)-i >= len(want) && slices.Equal(args[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

func TestCheckNode(t *testing.T) {
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		node config.Node
		err  string
	}{
		{config.Node{}, ""},
		{config.Node{Name: "ip-10-0-0-1.ec2.internal"}, ""},
		{config.Node{Name: "n1", Kubeconfig: "/k", Namespace: "ns", Advertise: "http://x"}, ""},
		{config.Node{Kubeconfig: "/k"}, "need --node-name"},
		{config.Node{Namespace: "ns"}, "need --node-name"},
		{config.Node{Advertise: "http://x"}, "need --node-name"},
		{config.Node{Name: "Node_1"}, `--node-name "Node_1" is not a DNS name`},
		{config.Node{Name: "-n"}, "is not a DNS name"},
		{config.Node{Name: "n-"}, "is not a DNS name"},
		{config.Node{Name: "a..b"}, "is not a DNS name"},
		{config.Node{Name: long}, "is not a DNS name"},
		{config.Node{Name: strings.Repeat("a.", 127) + "a"}, "is not a DNS name"},
	} {
		err := checkNode(tc.node)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("checkNode(%+v) = %v, want nil", tc.node, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("checkNode(%+v) = %v, want an error naming %q", tc.node, err, tc.err)
		case err != nil && !errors.As(err, new(*ConfigError)):
			t.Errorf("checkNode(%+v) = %T, want a *ConfigError", tc.node, err)
		}
	}
}
