// Package stock makes the root of the stock templates, base and
// code-interpreter-v1: a Debian root made on the host with debootstrap
// from the host's own apt sources, with E2B's base tools and, above it,
// the code interpreter's packages and kernels. It is kept as two image
// layers in an image store of its own, keyed by what it is made of, which
// every daemon that names the directory shares read-only.
package stock

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/ocilayer"
)

// The stock images, as the stock store names them.
const (
	Base        = "base"
	Interpreter = "code-interpreter-v1"
)

// BasePackages are what base has beyond Debian's minimal root: the tools
// of E2B's base template (bash, coreutils, curl, git, Python with pip and
// venv, Node.js with npm, a C toolchain) and a shell user's usual ones.
// sudo is the sandbox's own (internal/agent/sudo): Debian's is setuid,
// which no_new_privs disables.
var BasePackages = []string{
	"ca-certificates", "curl", "wget", "git", "openssh-client", "gnupg", "netbase",
	"python3", "python3-pip", "python3-venv", "python3-dev", "python3-setuptools", "python3-wheel",
	"nodejs", "npm", "build-essential",
	"procps", "less", "nano", "vim-tiny", "unzip", "zip", "xz-utils", "bzip2", "jq", "file", "tzdata",
}

// InterpreterPackages are what code-interpreter-v1 adds: Jupyter's
// Python and R kernels and the Python packages of E2B's code interpreter
// (its template's requirements.txt) that Debian packages. Not packaged
// by Debian, and so missing: bokeh, kaleido, librosa, orjson, spacy,
// textblob (pip installs them, with the internet).
var InterpreterPackages = []string{
	"python3-ipykernel", "python3-ipython", "python3-jupyter-client",
	"python3-numpy", "python3-pandas", "python3-matplotlib", "python3-pil", "python3-scipy",
	"python3-sklearn", "python3-skimage", "python3-seaborn", "python3-plotly", "python3-requests",
	"python3-aiohttp", "python3-bs4", "python3-openpyxl", "python3-xlrd", "python3-docx",
	"python3-nltk", "python3-gensim", "python3-soundfile", "python3-opencv", "python3-imageio",
	"python3-sympy", "python3-numba", "python3-xarray", "python3-joblib", "python3-tz",
	"python3-pytest", "python3-tornado", "python3-urllib3",
	"r-cran-irkernel",
}

// NPMPackages are the code interpreter's from the npm registry: tslab,
// Node's JavaScript (CommonJS require, top-level await) and TypeScript
// kernels.
var NPMPackages = []string{"tslab@1.0.22"}

//go:embed make.sh
var script []byte

// The Bash kernel of the code interpreter (Airlock's own), which make
// kernels also installs on the host for the jail.
var (
	//go:embed bash/kernel.json
	bashSpec []byte
	//go:embed bash/airlock_bash_kernel.py
	bashKernel []byte
)

// Env is the stock images' environment: E2B's PATH (sbin for root's
// commands), and pip's quiet defaults as E2B's code interpreter sets them.
var Env = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"PIP_DISABLE_PIP_VERSION_CHECK=1",
}

// Key names a stock root by what it is made of: the Debian suite, the
// package lists and the script. A root of another key is another
// directory, so a changed list never reuses an old root.
func Key(suite string) string {
	h := sha256.New()
	for _, part := range [][]string{{"stock-v1", suite}, BasePackages, InterpreterPackages, NPMPackages} {
		fmt.Fprintf(h, "%q\n", part)
	}
	h.Write(script)
	h.Write(bashSpec)
	h.Write(bashKernel)
	return suite + "-" + hex.EncodeToString(h.Sum(nil))[:16]
}

// Open returns the stock store in cache, made first if it is missing
// (debootstrap and apt from the host's sources: minutes, once). Two
// processes opening one cache make it once: the second waits for the
// first. log is told what is under way.
func Open(ctx context.Context, cache string, log *slog.Logger) (*image.Store, error) {
	srcs, err := readSources("/")
	if err != nil {
		return nil, err
	}
	key := Key(srcs.suite)
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return nil, fmt.Errorf("stock root: %w", err)
	}
	if err := checkOwned(cache); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(cache, key+".lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("stock root: %w", err)
	}
	defer lock.Close()
	if err := flock(ctx, lock); err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, key)
	store, err := image.Open(dir, image.DefaultLimits)
	if err != nil {
		return nil, err
	}
	if _, err := store.Get(Interpreter); err == nil {
		return store, nil // made before: the record is written last
	}
	log.Info("making the stock templates' Debian root, once (debootstrap and apt, from the host's apt sources)", "dir", dir, "suite", srcs.suite)
	start := time.Now()
	if err := build(ctx, store, filepath.Join(cache, key+".work"), srcs, log); err != nil {
		return nil, fmt.Errorf("make the stock root: %w", err)
	}
	log.Info("made the stock templates' Debian root", "dir", dir, "took", time.Since(start).Round(time.Second))
	return store, nil
}

// build makes the two layers in work and records the stock images.
func build(ctx context.Context, store *image.Store, work string, srcs *sources, log *slog.Logger) error {
	for _, tool := range []string{"debootstrap", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed on the host (apt-get install debootstrap)", tool)
		}
	}
	if err := cleanWork(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	defer cleanWork(work)
	sh := filepath.Join(work, "make.sh")
	aptSources := filepath.Join(work, "debian.sources")
	if err := os.WriteFile(sh, script, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(aptSources, srcs.deb822(), 0o644); err != nil {
		return err
	}
	base := filepath.Join(work, "base")
	log.Info("stock root: debootstrap and the base packages", "packages", len(BasePackages))
	args := append([]string{sh, "base", base, srcs.suite, srcs.mirror, aptSources}, BasePackages...)
	if err := run(ctx, args...); err != nil {
		return err
	}
	baseLayer, err := addLayer(ctx, store, base)
	if err != nil {
		return fmt.Errorf("the base layer: %w", err)
	}
	// The interpreter's layer is what an overlay above the base's root
	// gathers of its installs (make.sh mounts it): the base's layer is
	// shared, not copied.
	upper := filepath.Join(work, "upper")
	for _, d := range []string{upper, filepath.Join(work, "ovl"), filepath.Join(work, "merged")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	log.Info("stock root: the code interpreter's packages and kernels", "packages", len(InterpreterPackages)+len(NPMPackages))
	args = append([]string{sh, "interpreter", filepath.Join(work, "merged"), base, upper, filepath.Join(work, "ovl")}, InterpreterPackages...)
	args = append(append(args, "--"), NPMPackages...)
	if err := run(ctx, args...); err != nil {
		return err
	}
	// Written into the layer itself, the overlay gone: new files in
	// directories the installs made there.
	if err := writeBashKernel(upper); err != nil {
		return err
	}
	ciLayer, err := addLayer(ctx, store, upper)
	if err != nil {
		return fmt.Errorf("the code interpreter's layer: %w", err)
	}
	cfg := image.Config{Env: Env, User: layout.User, WorkingDir: layout.Home}
	now := time.Now().UTC()
	source := "debootstrap " + srcs.suite
	if err := store.Save(&image.Image{Name: Base, Source: source, Layers: []string{baseLayer.id}, Size: baseLayer.size, Config: cfg, Created: now}); err != nil {
		return err
	}
	return store.Save(&image.Image{Name: Interpreter, Source: source, Layers: []string{baseLayer.id, ciLayer.id},
		Size: baseLayer.size + ciLayer.size, Config: cfg, Created: now})
}

// run runs make.sh in a mount namespace of its own, private (Go's exec
// makes every mount in it private): what it mounts (/proc for maintainer
// scripts, the interpreter's overlay) is gone when it ends, however it
// ends, and never shows on the host.
func run(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "/bin/bash", args...)
	var stderr strings.Builder
	cmd.Stderr = &limited{w: &stderr, left: 64 << 10}
	cmd.Stdout = cmd.Stderr
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true, Unshareflags: unix.CLONE_NEWNS}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", filepath.Base(args[0]), args[1], err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// limited keeps the first left bytes written to it.
type limited struct {
	w    io.Writer
	left int
}

func (l *limited) Write(p []byte) (int, error) {
	if n := min(len(p), l.left); n > 0 {
		l.w.Write(p[:n])
		l.left -= n
	}
	return len(p), nil
}

type layer struct {
	id   string
	size int64
}

// addLayer stores the directory dir as a layer, through the store's
// unpacking and limits, as any image's.
func addLayer(ctx context.Context, store *image.Store, dir string) (layer, error) {
	d, err := os.Open(dir)
	if err != nil {
		return layer{}, err
	}
	defer d.Close()
	pr, pw := io.Pipe()
	go func() {
		// proc is a mount point, empty here; dev's nodes are left out by
		// the writer: every sandbox has its own.
		pw.CloseWithError(ocilayer.WriteUpperLayer(ctx, pw, d, 0, image.DefaultLimits.Entries, []string{"proc"}))
	}()
	id, size, err := store.AddLayer(pr, image.DefaultLimits.LayerBytes)
	pr.CloseWithError(errors.New("read no further"))
	return layer{id, size}, err
}

// writeBashKernel installs Airlock's Bash kernel in root.
func writeBashKernel(root string) error {
	dir := filepath.Join(root, "usr/local/share/jupyter/kernels/bash")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "kernel.json"), bashSpec, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "airlock_bash_kernel.py"), bashKernel, 0o644)
}

// cleanWork removes what a make left (its mounts went with it).
func cleanWork(work string) error {
	return os.RemoveAll(work)
}

// flock takes lock's exclusive lock, waiting for another process that
// holds it (making the root) until ctx ends.
func flock(ctx context.Context, lock *os.File) error {
	for {
		err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("stock root lock: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// checkOwned refuses a cache directory that anyone but root could
// write: its layers become the root of every stock sandbox.
func checkOwned(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("stock root: %w", err)
		}
		if st.Uid != 0 || st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("stock root: %s must be root's and writable by root alone", d)
		}
		if d == "/" {
			return nil
		}
	}
}
