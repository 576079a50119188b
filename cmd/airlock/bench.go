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
		return append(append(append([]string{self, "run"}, flags...), "--"), cmd...)
	}
	cases := []benchCase{
		{"bare /bin/true", tru},
		{"airlock run /bin/true", airlock(tru)},
		{"bare python", py},
		{"airlock run python", airlock(py)},
		{"airlock version", []string{self, "version"}},
	}
	// bubblewrap as the issue of one-shot cost puts it: every namespace,
	// the host's root read-only, a fresh /dev, /proc and /tmp.
	bwrap, bwrapErr := exec.LookPath("bwrap")
	if bwrapErr == nil {
		wrap := func(cmd []string) []string {
			return append([]string{bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
				"--unshare-all", "--die-with-parent", "--new-session"}, cmd...)
		}
		cases = append(cases, benchCase{"bwrap /bin/true", wrap(tru)}, benchCase{"bwrap python", wrap(py)})
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
			benchCase{"airlock run --backend gvisor", airlock(py, "--backend", "gvisor", "--runsc", runsc)},
			benchCase{"raw runsc do", append([]string{runsc, "--root", root, "--network", "none", "--platform", "systrap", "do"}, py...)},
		)
	}
	times := map[string][]time.Duration{}
	// One untimed round warms the page cache; then the cases take turns,
	// so that each sees the same machine conditions.
	for round := -1; round < *n; round++ {
		for _, c := range cases {
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
