package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// buildTemplate is airlock template build: the Dockerfile's steps run in
// a sandbox of its base, as the daemon's builds do, and the result is
// recorded in the store as name.
func buildTemplate(ctx context.Context, store *image.Store, stateDir, name, file, contextDir string, noCache bool, netMode string) error {
	if file == "" {
		return usageError{"template build needs -f DOCKERFILE"}
	}
	text, err := os.ReadFile(file)
	if err != nil {
		return usageError{fmt.Sprintf("Dockerfile: %v", errors.Unwrap(err))}
	}
	req, notes, err := build.ParseDockerfile(string(text))
	if err != nil {
		return usageError{err.Error()}
	}
	req.Force = noCache
	if contextDir == "" {
		contextDir = filepath.Dir(file)
	}
	bcfg, pol, err := daemon.BuildSettings(&config.Config{Builds: config.Builds{Network: netMode}})
	if err != nil {
		return usageError{err.Error()}
	}
	files, err := build.OpenFiles(filepath.Join(stateDir, "images", "uploads"), int64(bcfg.Upload))
	if err != nil {
		return err
	}
	// COPY's files go into the upload store as the SDK's would.
	for i := range req.Steps {
		if s := &req.Steps[i]; s.Type == "COPY" {
			if s.FilesHash, err = files.PutContext(contextDir, s.Args[0]); err != nil {
				return usageError{err.Error()}
			}
		}
	}
	if err := req.Check(); err != nil {
		return usageError{err.Error()}
	}
	out := newProgress(os.Stderr)
	defer out.stop()
	for _, n := range notes {
		out.log("info", "note: "+n)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	host, stop, err := daemon.BuildHost(ctx, stateDir, pol.Network.Mode != policy.NetNone, log)
	if err != nil {
		return err
	}
	defer stop()
	// The operator's own build: the host's network and credentials.
	b := &build.Builder{Store: store, Files: files, Host: host, Policy: pol, ReadyTimeout: time.Duration(bcfg.ReadyTimeout), OperatorAuth: true}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(bcfg.Timeout))
	defer cancel()
	start := time.Now()
	res, err := b.Build(ctx, []string{name}, req, image.Resources{}, out.log)
	if err != nil {
		var se *build.StepError
		if errors.As(err, &se) {
			return usageError{fmt.Sprintf("build failed at step %s: %v", se.Step, err)}
		}
		return err
	}
	out.stop()
	fmt.Printf("%s: %d layers, %s, built in %.1f s\n", res.Image.Name, len(res.Image.Layers), policy.FormatSize(res.Image.Size), time.Since(start).Seconds())
	return nil
}

// progress shows a build's log. On a terminal the current step stays on
// the last line with its time so far, the output scrolling above it;
// otherwise every line is printed as it comes.
type progress struct {
	w    io.Writer
	tty  bool
	mu   sync.Mutex
	step string
	at   time.Time
	done chan struct{}
	once sync.Once
}

func newProgress(f *os.File) *progress {
	p := &progress{w: f, tty: isTerminal(f), done: make(chan struct{})}
	if p.tty {
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-p.done:
					return
				case <-t.C:
					p.mu.Lock()
					p.redraw()
					p.mu.Unlock()
				}
			}
		}()
	}
	return p
}

func (p *progress) log(level, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty {
		if level != "progress" {
			fmt.Fprintln(p.w, msg)
		}
		return
	}
	if level == "progress" {
		// The status line only: a download's progress is not a log line.
		if p.step == "" {
			p.at = time.Now()
		}
		p.step = msg
		p.redraw()
		return
	}
	fmt.Fprint(p.w, "\r\033[K")
	switch {
	case strings.HasPrefix(msg, "["):
		p.step, p.at = msg, time.Now()
		fmt.Fprintf(p.w, "\033[1m%s\033[0m\n", msg)
	case level == "error":
		fmt.Fprintf(p.w, "\033[31m%s\033[0m\n", msg)
	default:
		fmt.Fprintf(p.w, "  \033[2m%s\033[0m\n", msg)
	}
	p.redraw()
}

func (p *progress) redraw() {
	if p.step != "" {
		fmt.Fprintf(p.w, "\r\033[K\033[36m%s (%.1f s)\033[0m", p.step, time.Since(p.at).Seconds())
	}
}

func (p *progress) stop() {
	p.once.Do(func() {
		close(p.done)
		p.mu.Lock()
		if p.tty {
			fmt.Fprint(p.w, "\r\033[K")
		}
		p.mu.Unlock()
	})
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
