package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/backend/gvisor"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// maxCodeFile bounds --file, which is read into memory and into the sandbox.
const maxCodeFile = 16 << 20

// languages maps --lang to the interpreter and the code file's extension.
var languages = map[string]struct{ interp, ext string }{
	"python": {"/usr/bin/python3", ".py"},
	"bash":   {"/bin/bash", ".sh"},
}

func langFromExt(name string) (string, bool) {
	for lang, l := range languages {
		if filepath.Ext(name) == l.ext {
			return lang, true
		}
	}
	return "", false
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// sizeFlag is a byte count such as 512M.
type sizeFlag struct{ v *int64 }

func (s sizeFlag) String() string {
	if s.v == nil {
		return ""
	}
	return policy.FormatSize(*s.v)
}

func (s sizeFlag) Set(v string) error {
	n, err := policy.ParseSize(v)
	if err != nil {
		return err
	}
	*s.v = n
	return nil
}

type runFlags struct {
	policy        policy.Policy
	mounts, env   listFlag
	file, lang    string
	code          string
	codeSet       bool
	stdin, asJSON bool
	argv          []string
	backend       string
	runsc         string
	net           string
	netSet        bool
	allow, deny   listFlag
	dns           listFlag
	template      string
	user          string
	stateDir      string
	workdirSet    bool
	daemon        string // auto, always or never
	runscSet      bool
}

func parseRunFlags(args []string) (*runFlags, error) {
	f := &runFlags{policy: policy.Default()}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	p := &f.policy
	fs.Var(sizeFlag{&p.MemoryBytes}, "memory", "memory limit (e.g. 512M)")
	fs.Int64Var(&p.Pids, "pids", p.Pids, "most processes and threads")
	fs.Float64Var(&p.CPUs, "cpus", p.CPUs, "CPU quota in cores")
	fs.DurationVar(&p.Timeout, "timeout", p.Timeout, "wall-clock limit")
	fs.Var(sizeFlag{&p.OutputLimit}, "output-limit", "bytes kept per output stream")
	fs.Var(sizeFlag{&p.DiskBytes}, "disk", "size of the writable file system")
	fs.Var(&f.mounts, "mount", "SRC:DST[:ro|:rw] host path to show inside (repeatable)")
	fs.Var(&f.env, "env", "KEY=VALUE environment variable (repeatable)")
	fs.StringVar(&p.Workdir, "workdir", p.Workdir, "working directory inside the sandbox")
	fs.StringVar(&f.file, "file", "", "code file to run (language from its extension)")
	fs.StringVar(&f.lang, "lang", "", "language of --code or --file: python or bash")
	fs.Func("code", "code to run", func(s string) error { f.code, f.codeSet = s, true; return nil })
	fs.BoolVar(&f.stdin, "stdin", false, "pass standard input to the sandbox")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON result instead of streaming output")
	fs.StringVar(&f.backend, "backend", "namespaces", "isolation: namespaces or gvisor")
	fs.StringVar(&f.runsc, "runsc", "", "runsc binary for --backend gvisor (default $AIRLOCK_RUNSC, then PATH)")
	fs.Func("net", "network: none (loopback only, the default) or internet", func(s string) error { f.net, f.netSet = s, true; return nil })
	fs.Var(&f.allow, "allow-out", "CIDR, IP, domain or *.domain the sandbox may reach (repeatable; without --net internet, nothing else)")
	fs.Var(&f.deny, "deny-out", "CIDR, IP, domain or *.domain the sandbox may not reach (repeatable)")
	fs.StringVar(&f.template, "template", "", "template to run in (airlock template list); default: the host's /usr, read-only")
	fs.StringVar(&f.user, "user", "user", "who runs the command: user, or root (of the sandbox; with --template)")
	stateDir := stateDirFlag(fs)
	fs.StringVar(&f.daemon, "daemon", "auto", "run in a sandbox of the pool of a local airlock serve (of --state-dir): auto (when one answers), always, or never")
	fs.Var(&f.dns, "dns", "upstream DNS server for the sandbox's resolver, IP[:PORT] (repeatable; default: the host's /etc/resolv.conf)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Println("usage: airlock run [flags] -- COMMAND [ARG…]   or   airlock run [flags] --file F | --code C")
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
			return nil, exitError{0}
		}
		return nil, usageError{err.Error()}
	}
	f.argv = fs.Args()
	f.stateDir = *stateDir
	fs.Visit(func(fl *flag.Flag) {
		f.workdirSet = f.workdirSet || fl.Name == "workdir"
		f.runscSet = f.runscSet || fl.Name == "runsc"
	})
	switch f.daemon {
	case "auto", "always", "never":
	default:
		return nil, usageError{fmt.Sprintf("--daemon must be auto, always or never, got %q", f.daemon)}
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	for _, m := range f.mounts {
		mt, err := policy.ParseMount(m, cwd)
		if err != nil {
			return nil, usageError{err.Error()}
		}
		p.Mounts = append(p.Mounts, mt)
	}
	p.Env = f.env
	if err := f.network(); err != nil {
		return nil, err
	}
	return f, nil
}

// network sets the policy's network from --net, --allow-out and --deny-out.
func (f *runFlags) network() error {
	n := &f.policy.Network
	var err error
	if n.AllowOut, err = policy.ParseRules(f.allow); err != nil {
		return usageError{err.Error()}
	}
	if n.DenyOut, err = policy.ParseRules(f.deny); err != nil {
		return usageError{err.Error()}
	}
	switch f.net {
	case "", "none":
		if f.netSet && len(f.allow)+len(f.deny) > 0 {
			return usageError{"--net none takes no --allow-out or --deny-out"}
		}
		if len(f.allow) > 0 {
			n.Mode = policy.NetFiltered
		} else if len(f.deny) > 0 {
			return usageError{"--deny-out needs a network: add --net internet or --allow-out"}
		}
	case "internet":
		n.Mode = policy.NetInternet
	default:
		return usageError{fmt.Sprintf("--net must be none or internet, got %q", f.net)}
	}
	if len(f.dns) > 0 && n.Mode == policy.NetNone {
		return usageError{"--dns needs a network: add --net internet or --allow-out"}
	}
	return nil
}

// command turns the flags into argv and the code files to put in the sandbox.
func (f *runFlags) command() ([]string, []backend.File, error) {
	hasCode := f.file != "" || f.codeSet
	switch {
	case f.file != "" && f.codeSet:
		return nil, nil, usageError{"--file and --code are exclusive"}
	case hasCode && len(f.argv) > 0:
		return nil, nil, usageError{"give a command after -- or --file/--code, not both"}
	case !hasCode && len(f.argv) == 0:
		return nil, nil, usageError{"nothing to run: give a command after -- or use --file or --code"}
	case !hasCode:
		if f.lang != "" {
			return nil, nil, usageError{"--lang applies only to --file and --code"}
		}
		return f.argv, nil, nil
	}
	lang, name := f.lang, "main"
	var data []byte
	if f.file != "" {
		name = filepath.Base(f.file)
		if lang == "" {
			l, ok := langFromExt(name)
			if !ok {
				return nil, nil, usageError{fmt.Sprintf("cannot tell the language of %s from its extension; use --lang", name)}
			}
			lang = l
		}
		var err error
		if data, err = readCodeFile(f.file); err != nil {
			return nil, nil, usageError{err.Error()}
		}
	} else {
		if lang == "" {
			lang = "python"
		}
		data = []byte(f.code)
	}
	l, ok := languages[lang]
	if !ok {
		return nil, nil, usageError{fmt.Sprintf("unknown language %q (python or bash)", lang)}
	}
	if f.codeSet {
		name += l.ext
	}
	file := backend.File{Name: name, Data: data}
	return []string{l.interp, layout.CodePath(name)}, []backend.File{file}, nil
}

func readCodeFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %v", path, errors.Unwrap(err))
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > maxCodeFile {
		return nil, fmt.Errorf("%s is larger than %s", path, policy.FormatSize(maxCodeFile))
	}
	return io.ReadAll(fh)
}

// jsonResult is the --json output.
type jsonResult struct {
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	ExitCode        int     `json:"exit_code"`
	Signal          *string `json:"signal"`
	TimedOut        bool    `json:"timed_out"`
	OOMKilled       bool    `json:"oom_killed"`
	StdoutTruncated bool    `json:"stdout_truncated"`
	StderrTruncated bool    `json:"stderr_truncated"`
	DurationMS      float64 `json:"duration_ms"`
	CPUMS           float64 `json:"cpu_ms"`
	MaxMemoryBytes  int64   `json:"max_memory_bytes"`
}

func runCmd(args []string) error {
	f, err := parseRunFlags(args)
	if err != nil {
		return err
	}
	argv, files, err := f.command()
	if err != nil {
		return err
	}
	// Sandboxes of airlock run keep their state in /run, apart from any
	// daemon's, and are cleaned up by the next airlock run.
	ns := namespaces.New(namespaces.DefaultStateDir, slog.New(slog.DiscardHandler))
	var b backend.Backend = ns
	switch f.backend {
	case "namespaces":
	case "gvisor":
		runsc, err := gvisor.FindRunsc(f.runsc)
		if err != nil {
			return usageError{err.Error()}
		}
		b = gvisor.New(runsc, gvisor.DefaultStateDir, slog.New(slog.DiscardHandler))
	default:
		return usageError{fmt.Sprintf("unknown backend %q (namespaces or gvisor)", f.backend)}
	}
	switch f.user {
	case "user":
	case "root":
		if f.template == "" {
			return usageError{"--user root needs --template: sandboxes of the host's view have only user"}
		}
		f.policy.Root = true
	default:
		return usageError{fmt.Sprintf("--user must be user or root, got %q", f.user)}
	}
	if f.template != "" {
		if err := f.useTemplate(); err != nil {
			return err
		}
	}
	spec := &backend.Spec{Policy: f.policy, Argv: argv, Files: files}
	if err := b.Check(spec); err != nil {
		return usageError{err.Error()}
	}
	if f.stdin {
		spec.Stdin = os.Stdin
	}
	var stdout, stderr strings.Builder
	if f.asJSON {
		spec.Stdout, spec.Stderr = &stdout, &stderr
	} else {
		spec.Stdout, spec.Stderr = terminalSafe(os.Stdout), terminalSafe(os.Stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	res, err := f.viaDaemon(ctx, spec)
	if res != nil || err != nil {
		if err == nil {
			err = f.report(res, &stdout, &stderr)
		}
		return err
	}
	if err := ns.Cleanup(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "airlock: warning: cleaning up earlier sandboxes:", err)
	}
	if f.policy.Network.Mode != policy.NetNone {
		att, detach, err := attachNetwork(ctx, f)
		if err != nil {
			return err
		}
		defer detach()
		spec.NetNS = att.Namespace()
	}
	res, err = b.Run(ctx, spec)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "airlock: interrupted; sandbox killed")
			return exitError{130}
		}
		return err
	}
	return f.report(res, &stdout, &stderr)
}

// report prints how the command ended (its JSON result with --json), and
// returns airlock's exit code.
func (f *runFlags) report(res *backend.Result, stdout, stderr *strings.Builder) error {
	code, reason := exitStatus(res, &f.policy)
	if f.asJSON {
		out := jsonResult{
			Stdout: stdout.String(), Stderr: stderr.String(),
			ExitCode: res.ExitCode, TimedOut: res.TimedOut, OOMKilled: res.OOMKilled,
			StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
			DurationMS:     float64(res.Duration.Microseconds()) / 1000,
			CPUMS:          float64(res.CPU.Microseconds()) / 1000,
			MaxMemoryBytes: res.MaxMemoryBytes,
		}
		if res.Signal != "" {
			out.Signal = &res.Signal
		}
		enc := json.NewEncoder(os.Stdout)
		if err := enc.Encode(&out); err != nil {
			return err
		}
	} else {
		if res.StdoutTruncated || res.StderrTruncated {
			fmt.Fprintf(os.Stderr, "airlock: output truncated at %s per stream\n", policy.FormatSize(f.policy.OutputLimit))
		}
		if reason != "" {
			fmt.Fprintln(os.Stderr, "airlock: killed:", reason)
		}
	}
	return exitError{code}
}

// useTemplate roots the sandbox in the template's image.
func (f *runFlags) useTemplate() error {
	if err := image.CheckName(f.template); err != nil {
		return usageError{err.Error()}
	}
	store, err := openImages(f.stateDir)
	if err != nil {
		return err
	}
	img, err := store.Get(f.template)
	if errors.Is(err, image.ErrNotFound) {
		return usageError{fmt.Sprintf("no template %q (airlock template list)", f.template)}
	}
	if err != nil {
		return err
	}
	return store.Apply(img, &f.policy, f.workdirSet)
}

// attachNetwork makes the sandbox's network, in this process: its proxy
// and resolver live as long as the run, and detach removes it and, if no
// other sandbox on the host has a network, the host's table.
func attachNetwork(ctx context.Context, f *runFlags) (att *netpolicy.Attachment, detach func(), err error) {
	cfg := netpolicy.Config{}
	if len(f.dns) > 0 {
		cfg.Upstream = f.dns
	}
	h, err := netpolicy.NewHost(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, nil, usageError{err.Error()}
	}
	if err := h.Cleanup(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock: warning: cleaning up earlier sandbox networks:", err)
	}
	detach = func() {
		if att != nil {
			att.Close()
		}
		if err := h.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "airlock: warning: removing the host's network table:", err)
		}
	}
	att, err = h.Attach(ctx, "run", f.policy.Network)
	if err != nil {
		detach()
		return nil, nil, fmt.Errorf("sandbox network: %w", err)
	}
	return att, detach, nil
}

// exitStatus maps a result to airlock's exit code, with the conventions of
// timeout(1) and the shell: 124 for the wall timeout, 137 for an OOM kill,
// 128+N for signal N, otherwise the program's own code.
func exitStatus(res *backend.Result, p *policy.Policy) (int, string) {
	switch {
	case res.TimedOut:
		return 124, "wall timeout " + p.Timeout.String()
	case res.OOMKilled:
		return 137, "memory limit " + policy.FormatSize(p.MemoryBytes)
	case res.Signal != "":
		return 128 + int(unix.SignalNum(res.Signal)), "signal " + res.Signal
	}
	return res.ExitCode, ""
}

// terminalSafe returns f, or, when f is a terminal, a writer that shows
// control characters instead of passing them: escape sequences from the
// sandbox could otherwise make the terminal answer, typing into the shell
// airlock runs in. Tabs, newlines, carriage returns and backspaces pass.
func terminalSafe(f *os.File) io.Writer {
	if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err != nil {
		return f
	}
	return &controlEscaper{w: f}
}

type controlEscaper struct {
	w       io.Writer
	pending bool // the last byte written was 0xC2, the lead byte of U+0080–U+009F
}

func (e *controlEscaper) Write(b []byte) (int, error) {
	out := make([]byte, 0, len(b)+8)
	for _, c := range b {
		if e.pending {
			e.pending = false
			if c >= 0x80 && c <= 0x9f { // a C1 control, such as CSI
				out = append(out, '?')
				continue
			}
			out = append(out, 0xc2)
		}
		switch {
		case c == 0xc2:
			e.pending = true
		case c == '\t' || c == '\n' || c == '\r' || c == '\b':
			out = append(out, c)
		case c < 0x20:
			out = append(out, '^', c+'@')
		case c == 0x7f:
			out = append(out, '^', '?')
		default:
			out = append(out, c)
		}
	}
	if _, err := e.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}
