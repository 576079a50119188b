package sandbox

import (
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Metrics are the manager's counters, written in Prometheus's text format
// by the API. (The format is small and stable; the client library would
// bring protobuf into a binary that starts twice per sandbox.)
type Metrics struct {
	creates        [2]atomic.Int64 // [cold, warm]
	createFailures atomic.Int64
	clones         atomic.Int64 // sandboxes cloned from warm snapshots
	warmMade       atomic.Int64 // warm snapshots made
	ended          atomic.Int64
	Execs          atomic.Int64 // process starts through the gateway

	mu      sync.Mutex
	buckets []float64 // create latency histogram upper bounds, seconds
	counts  []int64
	sum     float64
	count   int64
}

func newMetrics() *Metrics {
	b := []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
	return &Metrics{buckets: b, counts: make([]int64, len(b))}
}

func (m *Metrics) observeCreate(d time.Duration, warm bool) {
	i := 0
	if warm {
		i = 1
	}
	m.creates[i].Add(1)
	s := d.Seconds()
	m.mu.Lock()
	defer m.mu.Unlock()
	for j, ub := range m.buckets {
		if s <= ub {
			m.counts[j]++
		}
	}
	m.sum += s
	m.count++
}

// Write writes the metrics, with the sandbox counts the manager reports.
func (m *Metrics) Write(w io.Writer, running, pooled map[string]int) {
	gauge := func(name, help string, byTemplate map[string]int) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		keys := make([]string, 0, len(byTemplate))
		for k := range byTemplate {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s{template=%q} %d\n", name, k, byTemplate[k])
		}
	}
	gauge("airlock_sandboxes_running", "Sandboxes handed out and running, by template.", running)
	gauge("airlock_pool_ready", "Ready sandboxes waiting in the warm pool, by template.", pooled)
	fmt.Fprintf(w, "# HELP airlock_sandbox_creates_total Sandboxes created, by whether they came from the pool.\n# TYPE airlock_sandbox_creates_total counter\n")
	fmt.Fprintf(w, "airlock_sandbox_creates_total{source=\"cold\"} %d\n", m.creates[0].Load())
	fmt.Fprintf(w, "airlock_sandbox_creates_total{source=\"pool\"} %d\n", m.creates[1].Load())
	fmt.Fprintf(w, "# HELP airlock_warm_snapshot_clones_total Sandboxes started as clones of their template's warm snapshot, pooled or not.\n# TYPE airlock_warm_snapshot_clones_total counter\nairlock_warm_snapshot_clones_total %d\n", m.clones.Load())
	fmt.Fprintf(w, "# HELP airlock_warm_snapshots_made_total Warm snapshots made, one per version of a template that has one.\n# TYPE airlock_warm_snapshots_made_total counter\nairlock_warm_snapshots_made_total %d\n", m.warmMade.Load())
	fmt.Fprintf(w, "# HELP airlock_sandbox_create_failures_total Creates that failed.\n# TYPE airlock_sandbox_create_failures_total counter\nairlock_sandbox_create_failures_total %d\n", m.createFailures.Load())
	fmt.Fprintf(w, "# HELP airlock_sandboxes_ended_total Sandboxes killed, expired or ended.\n# TYPE airlock_sandboxes_ended_total counter\nairlock_sandboxes_ended_total %d\n", m.ended.Load())
	fmt.Fprintf(w, "# HELP airlock_execs_total Processes started in sandboxes through the gateway.\n# TYPE airlock_execs_total counter\nairlock_execs_total %d\n", m.Execs.Load())
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(w, "# HELP airlock_sandbox_create_seconds Time to hand out a sandbox.\n# TYPE airlock_sandbox_create_seconds histogram\n")
	for j, ub := range m.buckets {
		fmt.Fprintf(w, "airlock_sandbox_create_seconds_bucket{le=\"%g\"} %d\n", ub, m.counts[j])
	}
	fmt.Fprintf(w, "airlock_sandbox_create_seconds_bucket{le=\"+Inf\"} %d\n", m.count)
	fmt.Fprintf(w, "airlock_sandbox_create_seconds_sum %g\nairlock_sandbox_create_seconds_count %d\n", m.sum, m.count)
}
