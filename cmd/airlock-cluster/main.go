// Command airlock-cluster is what airlock runs for a cluster on
// Kubernetes: airlock router (the cluster's entry point), and beside each
// airlock serve --node-name, the node's registration with the API server.
// It is a binary of its own, embedded in airlock (internal/clusterbin),
// because Kubernetes' client packages cost every process that links them
// about 2 ms and 230 page faults at start, which airlock run, a one-shot
// measured against bubblewrap, must not pay.
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

	"k8s.io/client-go/dynamic"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/console"
	"github.com/airlock-sandbox/airlock/internal/httpserve"
)

// usageError is bad input: one line, exit code 2, as airlock's own.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "router":
		err = routerCmd(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "node":
		err = nodeCmd(os.Args[2:])
	default:
		err = usageError{"usage: airlock-cluster router|node [flags] (run by airlock)"}
	}
	if err == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "airlock: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
	if errors.As(err, new(usageError)) {
		os.Exit(2)
	}
	os.Exit(1)
}

// connect returns the API key every node and router of a cluster
// shares, and a client of the API server.
func connect(kubeconfig string) (string, dynamic.Interface, error) {
	key := os.Getenv("AIRLOCK_API_KEY")
	if key == "" {
		return "", nil, usageError{"AIRLOCK_API_KEY must be set: the router and every node share one API key"}
	}
	if err := apikey.Check("AIRLOCK_API_KEY", key); err != nil {
		return "", nil, usageError{err.Error()}
	}
	client, err := cluster.Client(kubeconfig)
	if err != nil {
		return "", nil, usageError{err.Error()}
	}
	return key, client, nil
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
	key, client, err := connect(*kubeconfig)
	if err != nil {
		return err
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
	url := "http://" + ln.Addr().String()
	// The key came from the environment (a Secret): never printed, it
	// would land in the pod's log.
	fmt.Printf("# E2B_API_KEY is the key in AIRLOCK_API_KEY (%s)\nE2B_API_URL=%s\nE2B_VOLUME_API_URL=%s\nE2B_SANDBOX_URL=%s\n", apikey.Fingerprint(key), url, url, url)
	log.Info("airlock router serving", "listen", ln.Addr().String(), "api_key", apikey.Fingerprint(key))
	srv, errc := httpserve.Serve(ln, rt, httpserve.Limits{})
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

// nodeCmd registers the airlock serve at --local as node --node-name
// and keeps it registered until SIGTERM (which its daemon sends when it
// stops, or the kernel when the daemon dies). It writes "registered" to
// --ready-fd, an inherited pipe, once the node is known to the cluster.
func nodeCmd(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("node-name", "", "the node's name")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster's API server (default: the pod's service account)")
	namespace := fs.String("namespace", "", "namespace of Airlock's objects")
	advertise := fs.String("advertise", "", "URL at which routers reach the node")
	local := fs.String("local", "", "URL of the node daemon's API on this host")
	capacity := fs.Int("capacity", 0, "the most sandboxes the node runs at once (0: no bound)")
	backends := fs.String("backends", "namespaces", "the backends a create may ask for, comma-separated")
	readyFD := fs.Int("ready-fd", -1, "an inherited pipe to write \"registered\" to")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if *name == "" || *advertise == "" || *local == "" {
		return usageError{"node needs --node-name, --advertise and --local"}
	}
	// What the CRD and every router would refuse, refused here first.
	if _, err := cluster.ParseAddress(*advertise); err != nil {
		return usageError{"--advertise: " + err.Error()}
	}
	key, client, err := connect(*kubeconfig)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := cluster.NodeConfig{
		Name: *name, Namespace: cluster.Namespace(*namespace), Address: *advertise,
		Backends: strings.Split(*backends, ","), Capacity: *capacity,
		Local: &cluster.LocalAPI{URL: *local, Key: key}, Log: log,
	}
	n, err := cluster.Register(ctx, client, cfg)
	if err != nil {
		return err
	}
	log.Info("airlock node registered", "node", *name, "namespace", cfg.Namespace, "address", *advertise, "id_prefix", cluster.IDPrefix(*name))
	if *readyFD >= 0 {
		ready := os.NewFile(uintptr(*readyFD), "ready")
		ready.WriteString("registered\n")
		ready.Close()
	}
	n.Run(ctx)
	return nil
}
