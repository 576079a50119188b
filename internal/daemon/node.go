package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/clusterbin"
	"github.com/airlock-sandbox/airlock/internal/config"
)

// A cluster on Kubernetes (README, "Many hosts"): airlock serve
// --node-name runs the cluster binary (cmd/airlock-cluster), which alone
// links Kubernetes' client packages, as its registration.

// checkNode refuses cluster settings without a node name, and a name
// the API server would not take.
func checkNode(n config.Node) error {
	if n.Name == "" {
		if n.Kubeconfig != "" || n.Namespace != "" || n.Advertise != "" {
			return configErrorf("--kubeconfig, --namespace and --advertise need --node-name")
		}
		return nil
	}
	if !dnsName(n.Name) {
		return configErrorf("--node-name %q is not a DNS name (lower-case letters, digits, '-' and '.')", n.Name)
	}
	return nil
}

// dnsName reports whether s is a DNS subdomain name, as Kubernetes names
// nodes (ip-10-0-0-1.ec2.internal) and the objects a node writes.
func dnsName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// nodeAgent is the cluster binary's node registration, running beside
// this daemon: it reads the daemon's load and sets its pools through the
// daemon's API at local, with the key.
type nodeAgent struct {
	args []string
	key  string
	log  *slog.Logger
	// command is the cluster binary with args (clusterbin.Command);
	// retry the wait before a registration that ended starts again.
	command  func(args ...string) (*exec.Cmd, error)
	retry    time.Duration
	stopping atomic.Bool
	current  atomic.Pointer[os.Process]
	done     chan struct{} // closed when the supervisor has stopped
}

// joinCluster starts the node's registration and returns once the node
// is known to the cluster; leave deregisters it and returns when that is
// done. A registration that dies later is started again.
func joinCluster(n config.Node, addr net.Addr, key string, backends []string, capacity int, log *slog.Logger) (leave func(), err error) {
	args, err := nodeArgs(n, addr, backends, capacity)
	if err != nil {
		return nil, err
	}
	a := &nodeAgent{args: args, key: key, log: log, command: clusterbin.Command, retry: 2 * time.Second, done: make(chan struct{})}
	return a.join()
}

// nodeArgs are the registration's arguments for a node that listens at
// addr.
func nodeArgs(n config.Node, addr net.Addr, backends []string, capacity int) ([]string, error) {
	tcp, _ := addr.(*net.TCPAddr)
	if tcp == nil {
		return nil, fmt.Errorf("cluster: cannot join from %s", addr)
	}
	address := n.Advertise
	if address == "" {
		if tcp.IP.IsUnspecified() {
			return nil, configErrorf("listening on %s, which routers cannot dial: give --advertise http://ADDRESS:PORT", addr)
		}
		address = "http://" + addr.String()
	}
	// The daemon's own API, from this host.
	local := tcp.IP
	if local.IsUnspecified() {
		local = net.IPv4(127, 0, 0, 1)
	}
	args := []string{"node", "--node-name", n.Name, "--advertise", address,
		"--local", "http://" + net.JoinHostPort(local.String(), strconv.Itoa(tcp.Port)),
		"--capacity", strconv.Itoa(capacity), "--backends", strings.Join(backends, ","), "--ready-fd", "3"}
	if n.Kubeconfig != "" {
		args = append(args, "--kubeconfig", n.Kubeconfig)
	}
	if n.Namespace != "" {
		args = append(args, "--namespace", n.Namespace)
	}
	return args, nil
}

// join starts the registration, and supervises it once the node is
// registered.
func (a *nodeAgent) join() (leave func(), err error) {
	exited, err := a.start(true)
	if err != nil {
		return nil, err
	}
	go a.supervise(exited)
	return a.leave, nil
}

// start runs the registration; with waitReady, until it says that the
// node is registered. exited yields its end.
func (a *nodeAgent) start(waitReady bool) (exited <-chan error, err error) {
	cmd, err := a.command(a.args...)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(cmd.Environ(), "AIRLOCK_API_KEY="+a.key)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr // the daemon's log
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd.ExtraFiles = []*os.File{w}
	// It deregisters when the daemon dies, however it dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		// Never unlocked: Pdeathsig fires when the thread that started
		// the child ends, and Go ends a locked thread only with its
		// goroutine, which lives as long as the child.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		a.current.Store(cmd.Process)
		started <- nil
		done <- cmd.Wait()
	}()
	err = <-started
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("cluster registration: %w", err)
	}
	if !waitReady {
		return done, nil
	}
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		ready <- line == "registered\n"
	}()
	select {
	case ok := <-ready:
		if ok {
			return done, nil
		}
		// The pipe closed without a word: it exited, its log says why.
		return nil, fmt.Errorf("the node could not join the cluster: %v", <-done)
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		return nil, errors.New("the node could not join the cluster in a minute (its log says why)")
	}
}

// supervise starts the registration again whenever it ends before leave.
func (a *nodeAgent) supervise(exited <-chan error) {
	defer close(a.done)
	for {
		err := <-exited
		if a.stopping.Load() {
			return
		}
		a.log.Error("cluster registration ended; starting it again", "err", err)
		for {
			time.Sleep(a.retry)
			if a.stopping.Load() {
				return
			}
			if exited, err = a.start(false); err == nil {
				break
			}
			a.log.Error("cluster registration", "err", err)
		}
	}
}

// leave stops the registration, which deregisters the node.
func (a *nodeAgent) leave() {
	a.stopping.Store(true)
	if p := a.current.Load(); p != nil {
		p.Signal(syscall.SIGTERM)
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		if p := a.current.Load(); p != nil {
			p.Kill()
		}
	}
}

// offered are the backends a create may ask this node for.
func (d *Daemon) offered() []string {
	if d.mcfg.AllowRequestBackend {
		return slices.Sorted(maps.Keys(d.backends.m))
	}
	return []string{d.isolation.Name()}
}
