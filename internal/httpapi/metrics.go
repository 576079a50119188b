package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Metrics: the daemon's, for Prometheus, one sandbox's (E2B's
// getMetrics) and several sandboxes' latest.

// prometheus serves the daemon's metrics in Prometheus' text format.
func (s *Server) prometheus(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	running, pooled := s.m.Counts()
	s.m.Metrics().Write(w, running, pooled)
}

// cpuCount is E2B's cpuCount, a whole number of cores, of a CPU limit
// that may be a fraction: the fewest whole cores that hold it.
func cpuCount(cpus float64) int64 { return int64(math.Ceil(cpus)) }

// metricOf is E2B's SandboxMetric of sb, measured at at.
func metricOf(sb *sandbox.Sandbox, at time.Time, u sandbox.Usage) map[string]any {
	return map[string]any{
		"timestamp":     at,
		"timestampUnix": at.Unix(),
		"cpuCount":      cpuCount(sb.CPUs),
		"cpuUsedPct":    math.Round(u.CPUPercent*100) / 100,
		"memUsed":       u.Memory,
		"memTotal":      sb.MemoryMB << 20,
		"memCache":      u.Cache,
		"diskUsed":      u.Disk,
		"diskTotal":     sb.DiskMB << 20,
	}
}

// Most sandboxes one GET /sandboxes/metrics names, as E2B.
const maxMetricsIDs = 100

// metricsList is E2B's GET /sandboxes/metrics: the latest metric of each
// running sandbox of ?sandbox_ids= (comma-separated); the others are left
// out, as E2B lists running sandboxes only. The latest is the last
// sample the daemon took, or, for a sandbox not sampled yet, one taken
// now.
func (s *Server) metricsList(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("sandbox_ids")
	if raw == "" {
		writeError(w, http.StatusBadRequest, "sandbox_ids is required: a comma-separated list of sandbox IDs")
		return
	}
	ids := strings.Split(raw, ",")
	if len(ids) > maxMetricsIDs {
		writeError(w, http.StatusBadRequest, "sandbox_ids names %d sandboxes, more than %d", len(ids), maxMetricsIDs)
		return
	}
	out := map[string]any{}
	for _, id := range ids {
		if _, done := out[id]; done {
			continue
		}
		sb, err := s.m.Get(id)
		if err != nil || sb.State() != sandbox.Running {
			continue
		}
		if h := sb.History(time.Time{}, time.Now()); len(h) > 0 {
			out[id] = metricOf(sb, h[len(h)-1].At.UTC(), h[len(h)-1].Usage)
			continue
		}
		if u, err := sb.Usage(r.Context()); err == nil {
			out[id] = metricOf(sb, time.Now().UTC(), u)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// metrics is E2B's getMetrics of one sandbox.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.PathValue("id"))
	if err != nil {
		s.managerError(w, err)
		return
	}
	metric := func(at time.Time, u sandbox.Usage) map[string]any { return metricOf(sb, at, u) }
	// ?start=&end= (Unix seconds): the samples taken then (the last hour
	// is kept); without them, one measured now.
	q := r.URL.Query()
	if q.Has("start") || q.Has("end") {
		start, end := time.Unix(0, 0), time.Now()
		for name, dst := range map[string]*time.Time{"start": &start, "end": &end} {
			if v := q.Get(name); v != "" {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil || n < 0 {
					writeError(w, http.StatusBadRequest, "%s must be a Unix time in seconds, not %q", name, v)
					return
				}
				*dst = time.Unix(n, 0)
			}
		}
		if end.Before(start) {
			writeError(w, http.StatusBadRequest, "end is before start")
			return
		}
		// end is a whole second: the samples of all of it.
		out := []map[string]any{}
		for _, sm := range sb.History(start, end.Add(time.Second-1)) {
			out = append(out, metric(sm.At, sm.Usage))
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	u, err := sb.Usage(r.Context())
	if err != nil {
		s.managerError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, []map[string]any{metric(time.Now().UTC(), u)})
}
