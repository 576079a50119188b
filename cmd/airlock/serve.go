package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/daemon"
)

// serveCmd is airlock serve: the daemon of its flags, environment and
// config file (package daemon assembles it), and, in a cluster, a node.
func serveCmd(args []string) error {
	// Catch SIGTERM from the start: one that arrives while sandboxes are
	// being started must still shut down cleanly, not kill the daemon.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A log reader that goes away (a closed terminal, a parent that
	// exited) must not kill the daemon: Go exits on SIGPIPE from a write
	// to stdout or stderr unless the signal is handled. Writes then fail.
	signal.Ignore(syscall.SIGPIPE)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags := config.ServeFlags(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	cfg, err := config.Resolve(os.Getenv, flags)
	if err != nil {
		return usageError{err.Error()}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The daemon grows with its sandboxes; a small process forks their
	// inits for it (internal/backend/namespaces/spawner.go).
	namespaces.ForkThroughSpawner()
	d, err := daemon.New(ctx, cfg, daemon.Options{Log: log})
	if err != nil {
		return err
	}
	announce(os.Stdout, isTerminal(os.Stdout), d.Key(), d.URL())
	return d.Serve(ctx)
}

// announce prints what an E2B client needs, as environment lines. The
// key itself only when this start generated it and stdout is a
// terminal: a key printed to a pipe or a file lands in logs (a service's
// journal, a pod's log) and outlives the screen. Otherwise a comment
// says where the key is and gives its fingerprint.
func announce(w io.Writer, tty bool, key daemon.Key, url string) {
	if key.Generated && tty {
		fmt.Fprintf(w, "E2B_API_KEY=%s\n", key.Value)
	} else {
		fmt.Fprintf(w, "# E2B_API_KEY is the key in %s (%s)\n", key.From, apikey.Fingerprint(key.Value))
	}
	// The SDK's Volume reaches a volume's files at E2B_VOLUME_API_URL.
	fmt.Fprintf(w, "E2B_API_URL=%s\nE2B_VOLUME_API_URL=%s\nE2B_SANDBOX_URL=%s\n", url, url, url)
}
