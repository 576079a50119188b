package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/tabwriter"

	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/stock"
)

const templateUsage = `usage: airlock template <command> [flags]

commands:
  build  NAME -f FILE     build template NAME from a Dockerfile (its steps run in a sandbox)
  pull   NAME REFERENCE   pull an image from an OCI registry as template NAME
  import NAME PATH        import a docker save archive or an OCI image layout directory
  list                    list the templates
  rm     NAME             remove a template (and the layers no other template has)
  stock                   make the stock templates' Debian root now (airlock serve makes it
                          at its first start otherwise), or find it made

flags of stock:
  --cache DIR             where made roots are kept (default /var/cache/airlock/stock, $AIRLOCK_STOCK_CACHE)

flags (every command):
  --state-dir DIR         where templates are kept (default /var/lib/airlock, $AIRLOCK_STATE_DIR)

flags of build:
  -f FILE                 the Dockerfile (FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, CMD, ENTRYPOINT)
  --context DIR           where COPY takes files from (default: the Dockerfile's directory)
  --no-cache              build even if the same base and steps were built before
  --net internet|none     the build sandbox's network (default internet)
`

func stateDirFlag(fs *flag.FlagSet) *string {
	d := os.Getenv("AIRLOCK_STATE_DIR")
	if d == "" {
		// airlock serve's, which keeps templates too.
		d = config.Default().StateDir
	}
	return fs.String("state-dir", d, "where templates are kept")
}

// openImages opens the template store of a state directory.
func openImages(stateDir string) (*image.Store, error) {
	if !filepath.IsAbs(stateDir) {
		return nil, usageError{fmt.Sprintf("state directory %q is not an absolute path", stateDir)}
	}
	if os.Geteuid() != 0 {
		return nil, usageError{"templates need root (their layers keep the image's owners)"}
	}
	return image.Open(filepath.Join(stateDir, "images"), image.DefaultLimits)
}

func templateCmd(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, templateUsage)
		return exitError{2}
	}
	fs := flag.NewFlagSet("template", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	stateDir := stateDirFlag(fs)
	file := fs.String("f", "", "Dockerfile")
	contextDir := fs.String("context", "", "build context")
	noCache := fs.Bool("no-cache", false, "do not reuse an earlier build")
	netMode := fs.String("net", "internet", "the build's network")
	cache := fs.String("cache", cmp.Or(os.Getenv("AIRLOCK_STOCK_CACHE"), config.DefaultStockCache), "where stock roots are kept")
	// Flags may come before, between or after the arguments.
	var a []string
	for rest := args[1:]; ; {
		if err := fs.Parse(rest); err != nil {
			return usageError{err.Error()}
		}
		if fs.NArg() == 0 {
			break
		}
		a, rest = append(a, fs.Arg(0)), fs.Args()[1:]
	}
	want := map[string]int{"build": 1, "pull": 2, "import": 2, "list": 0, "ls": 0, "rm": 1, "stock": 0}
	n, ok := want[args[0]]
	if !ok {
		return usageError{fmt.Sprintf("unknown template command %q (build, pull, import, list, rm, stock)", args[0])}
	}
	if len(a) != n {
		return usageError{fmt.Sprintf("template %s takes %d argument(s), got %d", args[0], n, len(a))}
	}
	if n > 0 {
		if err := image.CheckName(a[0]); err != nil {
			return usageError{err.Error()}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "stock": // its own store, not the state directory's
		return stockRoot(ctx, *cache)
	}
	store, err := openImages(*stateDir)
	if err != nil {
		return err
	}
	var img *image.Image
	switch args[0] {
	case "build":
		return buildTemplate(ctx, store, *stateDir, a[0], *file, *contextDir, *noCache, *netMode)
	case "pull":
		fmt.Fprintf(os.Stderr, "pulling %s\n", a[1])
		out := newProgress(os.Stderr)
		ctx := image.WithProgress(ctx, func(layer, layers int, n int64) {
			out.log("progress", fmt.Sprintf("layer %d of %d: %.1f MB", layer, layers, float64(n)/1e6))
		})
		img, err = store.Pull(ctx, a[1], a[0], nil)
		out.stop()
	case "import":
		if _, err := os.Stat(a[1]); err != nil {
			return usageError{fmt.Sprintf("image archive %s: %v", a[1], errors.Unwrap(err))}
		}
		img, err = store.Import(ctx, a[1], a[0])
	case "list", "ls":
		imgs, err := store.List()
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tLAYERS\tSIZE\tSOURCE")
		for _, img := range imgs {
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", img.Name, len(img.Layers), policy.FormatSize(img.Size), img.Source)
		}
		return w.Flush()
	case "rm":
		err = store.Remove(a[0])
		if errors.Is(err, image.ErrNotFound) {
			return usageError{err.Error()}
		}
		return err
	}
	var ue *image.UnpackError
	if errors.As(err, &ue) {
		return usageError{"refused: " + err.Error()}
	}
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d layers, %s\n", img.Name, len(img.Layers), policy.FormatSize(img.Size))
	return nil
}

// stockRoot makes the stock templates' Debian root in cache, unless it
// is there, and says where it is and what it holds.
func stockRoot(ctx context.Context, cache string) error {
	if !filepath.IsAbs(cache) {
		return usageError{fmt.Sprintf("stock cache %q is not an absolute path", cache)}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	store, err := stock.Open(ctx, cache, log)
	if err != nil {
		return err
	}
	for _, n := range []string{stock.Base, stock.Interpreter} {
		img, err := store.Get(n)
		if err != nil {
			return err
		}
		fmt.Printf("%s: %d layers, %s\n", img.Name, len(img.Layers), policy.FormatSize(img.Size))
	}
	return nil
}
