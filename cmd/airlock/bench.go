package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/internal/backend/gvisor"
)

// benchCase is one command line timed by benchCmd.
type benchCase struct {
	name string
	argv []string
	// before, if set, runs untimed before each sample: the daemon's
	// cases wait for its pool to refill, so that neither a sample nor
	// the cases after it pay for the one before.
	before func() error
}

// benchCmd times one-shot runs against their baselines, in alternation so
// that every case sees the same machine conditions, and prints medians
// and ratios: airlock run against the bare command and against
// bubblewrap with every namespace (the cost of a sandbox elsewhere), and
// airlock run --backend gvisor against a raw runsc do. It asserts nothing.
func benchCmd(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.Int("n", 50, "rounds")
	python := fs.String("python", "/usr/bin/python3", "interpreter to run")
	noDaemon := fs.Bool("no-daemon", false, "do not measure airlock run through a local airlock serve")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if *n < 1 {
		return usageError{"-n must be at least 1"}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	py := []string{*python, "-c", "print(1)"}
	tru := []string{"/bin/true"}
	airlock := func(cmd []string, flags ...string) []string {
		return append(append(append([]string{self, "run", "--daemon", "never"}, flags...), "--"), cmd...)
	}
	cases := []benchCase{
		{name: "bare /bin/true", argv: tru},
		{name: "airlock run /bin/true", argv: airlock(tru)},
		{name: "bare python", argv: py},
		{name: "airlock run python", argv: airlock(py)},
		{name: "airlock version", argv: []string{self, "version"}},
	}
	// Through a local airlock serve's pool, from a server of its own
	// whose base is the host's view, as airlock run's.
	var srv *benchServer
	if !*noDaemon {
		if srv, err = startBenchServer(self); err != nil {
			return err
		}
		defer srv.stop()
		via := func(cmd []string) []string {
			return append([]string{self, "run", "--daemon", "always", "--state-dir", srv.dir, "--"}, cmd...)
		}
		cases = append(cases,
			benchCase{name: "daemon run /bin/true", argv: via(tru), before: srv.settle},
			benchCase{name: "daemon run python", argv: via(py), before: srv.settle})
	}
	// bubblewrap as the issue of one-shot cost puts it: every namespace,
	// the host's root read-only, a fresh /dev, /proc and /tmp.
	bwrap, bwrapErr := exec.LookPath("bwrap")
	if bwrapErr == nil {
		wrap := func(cmd []string) []string {
			return append([]string{bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
				"--unshare-all", "--die-with-parent", "--new-session"}, cmd...)
		}
		cases = append(cases, benchCase{name: "bwrap /bin/true", argv: wrap(tru)}, benchCase{name: "bwrap python", argv: wrap(py)})
	}
	// With runsc at hand, gVisor too, against raw runsc ("runsc do" runs a
	// command in a fresh gVisor sandbox over the host's file system).
	runsc, runscErr := gvisor.FindRunsc("")
	if runscErr == nil {
		root, err := os.MkdirTemp("", "airlock-bench-runsc-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(root)
		cases = append(cases,
			benchCase{name: "airlock run --backend gvisor", argv: airlock(py, "--backend", "gvisor", "--runsc", runsc)},
			benchCase{name: "raw runsc do", argv: append([]string{runsc, "--root", root, "--network", "none", "--platform", "systrap", "do"}, py...)},
		)
	}
	times := map[string][]time.Duration{}
	// One untimed round warms the page cache; then the cases take turns,
	// so that each sees the same machine conditions.
	for round := -1; round < *n; round++ {
		for _, c := range cases {
			if c.before != nil {
				if err := c.before(); err != nil {
					return err
				}
			}
			d, err := timeRun(c.argv)
			if err != nil {
				return err
			}
			if round >= 0 {
				times[c.name] = append(times[c.name], d)
			}
		}
	}
	med := func(name string) float64 { return ms(median(times[name])) }
	fmt.Printf("%d rounds, the cases run in turn; medians and 90th percentiles\n", *n)
	for _, c := range cases {
		fmt.Printf("  %-30s %8.2f ms  p90 %8.2f ms\n", c.name, med(c.name), ms(pct(times[c.name], 90)))
	}
	fmt.Printf("airlock run python / bare python: %.2fx\n", med("airlock run python")/med("bare python"))
	if bwrapErr == nil {
		fmt.Printf("bwrap python / bare python: %.2fx\n", med("bwrap python")/med("bare python"))
		for _, cmd := range []string{"/bin/true", "python"} {
			a, b := med("airlock run "+cmd)-med("bare "+cmd), med("bwrap "+cmd)-med("bare "+cmd)
			fmt.Printf("overhead over bare %s: airlock %.2f ms, bwrap %.2f ms: %.2fx bwrap's\n", cmd, a, b, a/b)
		}
	} else {
		fmt.Println("bubblewrap not measured: no bwrap on PATH (Debian's bubblewrap)")
	}
	if srv != nil && bwrapErr == nil {
		var a, b float64
		for _, cmd := range []string{"/bin/true", "python"} {
			d, w := med("daemon run "+cmd), med("bwrap "+cmd)
			a, b = a+d, b+w
			fmt.Printf("through the daemon %s: %.2f ms, bwrap %.2f ms: %.2fx bwrap's time; overhead over bare %.2f ms\n", cmd, d, w, d/w, d-med("bare "+cmd))
		}
		fmt.Printf("through the daemon, both: %.2f ms, bwrap %.2f ms: %.2fx\n", a, b, a/b)
	}
	if runscErr == nil {
		fmt.Printf("airlock run --backend gvisor / raw runsc do: %.2fx\n", med("airlock run --backend gvisor")/med("raw runsc do"))
	} else {
		fmt.Printf("gVisor not measured: %v\n", runscErr)
	}
	return nil
}

func timeRun(argv []string) (time.Duration, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("bench: %q failed: %v: %s", argv, err, out)
	}
	return d, nil
}

func median(d []time.Duration) time.Duration { return pct(d, 50) }

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
