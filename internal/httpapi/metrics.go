package httpapi

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Metrics: the daemon's, for Prometheus, and one sandbox's (E2B's
// getMetrics).

// prometheus serves the daemon's metrics in Prometheus' text format.
func (s *Server) prometheus(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	running, pooled := s.m.Counts()
	s.m.Metrics().Write(w, running, pooled)
}

// cpuCount is E2B's cpuCount, a whole number of cores, of a CPU limit
// that may be a fraction: the fewest whole cores that hold it.
func cpuCount(cpus float64) int64 { return int64(math.Ceil(cpus)) }

// metrics is E2B's getMetrics of one sandbox.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.PathValue("id"))
	if err != nil {
		s.managerError(w, err)
		return
	}
	metric := func(at time.Time, u sandbox.Usage) map[string]any {
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
