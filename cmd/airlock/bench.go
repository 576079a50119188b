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

// benchCmd compares a sandboxed run with the same command run bare, in
// alternation so that both see the same machine conditions, and prints
// medians and their ratio. It asserts nothing.
func benchCmd(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.Int("n", 50, "pairs of runs")
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
	code := "print(1)"
	cases := []struct {
		name string
		argv []string
	}{
		{"bare python", []string{*python, "-c", code}},
		{"airlock run python", []string{self, "run", "--", *python, "-c", code}},
		// The parts of the cost: a sandbox around a program that does
		// nothing, and the airlock process alone (Go's start and exit).
		{"airlock run /bin/true", []string{self, "run", "--", "/bin/true"}},
		{"bare /bin/true", []string{"/bin/true"}},
		{"airlock version", []string{self, "version"}},
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
			struct {
				name string
				argv []string
			}{"airlock run --backend gvisor", []string{self, "run", "--backend", "gvisor", "--runsc", runsc, "--", *python, "-c", code}},
			struct {
				name string
				argv []string
			}{"raw runsc do", []string{runsc, "--root", root, "--network", "none", "--platform", "systrap", "do", *python, "-c", code}},
		)
	}
	times := make([][]time.Duration, len(cases))
	// One untimed round warms the page cache; then the cases take turns,
	// so that each sees the same machine conditions.
	for round := -1; round < *n; round++ {
		for i, c := range cases {
			d, err := timeRun(c.argv)
			if err != nil {
				return err
			}
			if round >= 0 {
				times[i] = append(times[i], d)
			}
		}
	}
	fmt.Printf("%d rounds, the cases run in turn; medians and 90th percentiles\n", *n)
	for i, c := range cases {
		fmt.Printf("  %-24s %7.2f ms  p90 %7.2f ms\n", c.name, ms(median(times[i])), ms(pct(times[i], 90)))
	}
	ratio := float64(median(times[1])) / float64(median(times[0]))
	fixed := median(times[2]) - median(times[3])
	fmt.Printf("airlock run python / bare python: %.2fx (a sandbox adds %.2f ms, of which %.2f ms is the airlock process itself)\n",
		ratio, ms(fixed), ms(median(times[4])))
	if runscErr == nil {
		fmt.Printf("airlock run --backend gvisor / raw runsc do: %.2fx\n", float64(median(times[5]))/float64(median(times[6])))
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
