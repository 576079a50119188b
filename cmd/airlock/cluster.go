package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/console"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// nodeFlags make airlock serve a node of a cluster (internal/cluster).
type nodeFlags struct {
	name, kubeconfig, namespace, advertise string
}

func (f *nodeFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&f.name, "node-name", os.Getenv("AIRLOCK_NODE_NAME"), "join a cluster as this node (registers with the Kubernetes API server)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster's API server (default: the pod's service account)")
	fs.StringVar(&f.namespace, "namespace", "", "namespace of Airlock's objects (default $AIRLOCK_NAMESPACE, the pod's, then airlock)")
	fs.StringVar(&f.advertise, "advertise", os.Getenv("AIRLOCK_ADVERTISE"), "URL at which routers reach this node (default http://LISTEN)")
}

// check refuses cluster flags without a node name, and a name the API
// server would not take.
func (f *nodeFlags) check() error {
	if f.name == "" {
		if f.kubeconfig != "" || f.namespace != "" || f.advertise != "" {
			return usageError{"--kubeconfig, --namespace and --advertise need --node-name"}
		}
		return nil
	}
	if !dnsName(f.name) {
		return usageError{fmt.Sprintf("--node-name %q is not a DNS name (lower-case letters, digits, '-' and '.')", f.name)}
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

// join registers the node and keeps it registered; leave deregisters it
// and returns when that is done.
func (f *nodeFlags) join(ctx context.Context, addr net.Addr, m *sandbox.Manager, backends []string, capacity int, log *slog.Logger) (leave func(), err error) {
	address := f.advertise
	if address == "" {
		tcp, _ := addr.(*net.TCPAddr)
		if tcp == nil || tcp.IP.IsUnspecified() {
			return nil, usageError{fmt.Sprintf("listening on %s, which routers cannot dial: give --advertise http://ADDRESS:PORT", addr)}
		}
		address = "http://" + addr.String()
	}
	client, err := cluster.Client(f.kubeconfig)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	cfg := cluster.NodeConfig{
		Name: f.name, Namespace: cluster.Namespace(f.namespace), Address: address,
		Backends: backends, Capacity: capacity, Manager: m, Log: log,
	}
	n, err := cluster.Register(ctx, client, cfg)
	if err != nil {
		return nil, err
	}
	log.Info("airlock node registered", "node", f.name, "namespace", cfg.Namespace, "address", address, "id_prefix", cluster.IDPrefix(f.name))
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(runCtx); close(done) }()
	return func() { cancel(); <-done }, nil
}

// routerCmd is airlock router: the cluster's E2B-compatible entry point.
func routerCmd(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	signal.Ignore(syscall.SIGPIPE)
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster's API server (default: the pod's service account)")
	namespace := fs.String("namespace", "", "namespace of Airlock's objects (default $AIRLOCK_NAMESPACE, the pod's, then airlock)")
	listen := fs.String("listen", "127.0.0.1:49980", "address to listen on")
	domain := fs.String("domain", "", "sandboxes' servers answer at {port}-{sandboxID}.DOMAIN (default localhost:PORT)")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	key := os.Getenv("AIRLOCK_API_KEY")
	if key == "" {
		return usageError{"AIRLOCK_API_KEY must be set: the router and every node share one API key"}
	}
	client, err := cluster.Client(*kubeconfig)
	if err != nil {
		return usageError{err.Error()}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return usageError{fmt.Sprintf("listen on %s: %v", *listen, errors.Unwrap(err))}
	}
	defer ln.Close()
	if *domain == "" {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		*domain = "localhost:" + port
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	rt, err := cluster.NewRouter(ctx, client, cluster.Namespace(*namespace), key, *domain, log)
	if err != nil {
		return err
	}
	rt.Console = console.Handler()
	srv := &http.Server{Handler: rt, ReadHeaderTimeout: 30 * time.Second}
	url := "http://" + ln.Addr().String()
	fmt.Printf("E2B_API_KEY=%s\nE2B_API_URL=%s\nE2B_SANDBOX_URL=%s\n", key, url, url)
	log.Info("airlock router serving", "listen", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(shutdown)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
