package sandbox

import (
	"strings"
	"testing"
	"time"
)

// The counters come out in Prometheus's text format: a HELP and a TYPE
// per metric, gauges per template, and a cumulative histogram.
func TestMetricsWrite(t *testing.T) {
	m := newMetrics()
	m.observeCreate(3*time.Millisecond, false)
	m.observeCreate(2*time.Second, true)
	m.observeCreate(time.Minute, true)
	m.createFailures.Add(1)
	m.Execs.Add(4)
	var sb strings.Builder
	m.Write(&sb, map[string]int{"base": 2, "a": 1}, map[string]int{"base": 3})
	out := sb.String()
	for _, want := range []string{
		"# TYPE airlock_sandboxes_running gauge\n",
		"airlock_sandboxes_running{template=\"a\"} 1\nairlock_sandboxes_running{template=\"base\"} 2\n",
		"airlock_pool_ready{template=\"base\"} 3\n",
		"airlock_sandbox_creates_total{source=\"cold\"} 1\n",
		"airlock_sandbox_creates_total{source=\"pool\"} 2\n",
		"airlock_sandbox_create_failures_total 1\n",
		"airlock_execs_total 4\n",
		"airlock_sandbox_create_seconds_bucket{le=\"0.001\"} 0\n",
		"airlock_sandbox_create_seconds_bucket{le=\"0.005\"} 1\n",
		"airlock_sandbox_create_seconds_bucket{le=\"2.5\"} 2\n",
		"airlock_sandbox_create_seconds_bucket{le=\"5\"} 2\n",
		"airlock_sandbox_create_seconds_bucket{le=\"+Inf\"} 3\n",
		"airlock_sandbox_create_seconds_count 3\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the metrics lack %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasPrefix(line, "# HELP airlock_") && !strings.HasPrefix(line, "# TYPE airlock_") && !strings.HasPrefix(line, "airlock_") {
			t.Errorf("a line that is no metric: %q", line)
		}
	}
}

// A manager counts what it does, and its Metrics are the ones it counts.
func TestManagerCounts(t *testing.T) {
	m, b := newManager(t, Config{}, 1)
	waitFor(t, m, "the pool is full", func() bool { return pooled(m) == 1 })
	create(t, m, CreateRequest{})
	b.SetStartError(errAny)
	// Limits of its own: started for it, not claimed.
	if _, err := m.Create(t.Context(), CreateRequest{TemplateID: "base", Limits: Limits{CPUs: 0.5}}); err == nil {
		t.Fatal("a create whose box fails succeeded")
	}
	mt := m.Metrics()
	if mt.creates[1].Load() != 1 || mt.createFailures.Load() != 1 {
		t.Errorf("%d warm creates, %d failures; want 1, 1", mt.creates[1].Load(), mt.createFailures.Load())
	}
}
