package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"time"
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
	bare := []string{*python, "-c", code}
	sandboxed := []string{self, "run", "--", *python, "-c", code}
	// One untimed round of each warms the page cache.
	for _, argv := range [][]string{bare, sandboxed} {
		if err := timeRun(argv, nil); err != nil {
			return err
		}
	}
	var tBare, tBox, ratios []time.Duration
	for range *n {
		if err := timeRun(bare, &tBare); err != nil {
			return err
		}
		if err := timeRun(sandboxed, &tBox); err != nil {
			return err
		}
		ratios = append(ratios, tBox[len(tBox)-1]*1000/tBare[len(tBare)-1])
	}
	fmt.Printf("%s -c %q, %d pairs, run alternately\n", *python, code, *n)
	fmt.Printf("  bare         median %6.2f ms  p90 %6.2f ms\n", ms(median(tBare)), ms(pct(tBare, 90)))
	fmt.Printf("  airlock run  median %6.2f ms  p90 %6.2f ms\n", ms(median(tBox)), ms(pct(tBox, 90)))
	fmt.Printf("  ratio of medians %.2fx, median of pair ratios %.2fx\n",
		float64(median(tBox))/float64(median(tBare)), float64(median(ratios))/1000)
	return nil
}

func timeRun(argv []string, into *[]time.Duration) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		return fmt.Errorf("bench: %q failed: %v: %s", argv, err, out)
	}
	if into != nil {
		*into = append(*into, d)
	}
	return nil
}

func median(d []time.Duration) time.Duration { return pct(d, 50) }

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
