package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Logs: a sandbox's (E2B's sandbox logs: sandbox.LogEntry) and a template
// build's, with E2B's queries: from a time (cursor, in ms) forward or
// backward, at least a level, a substring, at most a number.

// levels ranks E2B's log levels.
var levels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// logQuery is what a client asks of a log.
type logQuery struct {
	cursor   *int64 // ms since the epoch; nil: from the start (forward) or the end (backward)
	limit    int
	backward bool // newest first, from the cursor back
	minLevel int
	search   string
}

// parseLogQuery reads q's log parameters: cursorName (E2B's v1 routes
// call it start), limit (at most maxLimit, def when absent), direction
// (def: backward if newestFirst), level and search.
func parseLogQuery(q url.Values, cursorName string, maxLimit, def int, newestFirst bool) (logQuery, error) {
	lq := logQuery{limit: def, backward: newestFirst}
	if v := q.Get(cursorName); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return lq, fmt.Errorf("%s must be a time in milliseconds since the epoch, not %q", cursorName, v)
		}
		lq.cursor = &n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxLimit {
			return lq, fmt.Errorf("limit must be a number from 0 to %d, not %q", maxLimit, v)
		}
		lq.limit = n
	}
	switch v := q.Get("direction"); v {
	case "":
	case "forward", "backward":
		lq.backward = v == "backward"
	default:
		return lq, fmt.Errorf("direction must be forward or backward, not %q", v)
	}
	if v := q.Get("level"); v != "" {
		rank, ok := levels[v]
		if !ok {
			return lq, fmt.Errorf("level must be debug, info, warn or error, not %q", v)
		}
		lq.minLevel = rank
	}
	lq.search = q.Get("search")
	if len(lq.search) > 256 {
		return lq, fmt.Errorf("search is longer than 256 characters")
	}
	return lq, nil
}

// pick returns what of all (oldest first) the query asks for, in the
// order it asks for; line gives an entry's time, level and message.
func pick[T any](all []T, lq logQuery, line func(T) (time.Time, string, string)) []T {
	out := []T{}
	keep := func(e T) bool {
		at, level, msg := line(e)
		switch {
		case levels[level] < lq.minLevel, !strings.Contains(msg, lq.search):
			return false
		case lq.cursor != nil && lq.backward:
			return at.UnixMilli() <= *lq.cursor
		case lq.cursor != nil:
			return at.UnixMilli() >= *lq.cursor
		}
		return true
	}
	if lq.backward {
		for i := len(all) - 1; i >= 0 && len(out) < lq.limit; i-- {
			if keep(all[i]) {
				out = append(out, all[i])
			}
		}
		return out
	}
	for _, e := range all {
		if len(out) == lq.limit {
			break
		}
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// sandboxLogEntry is E2B's SandboxLogEntry; its fields have the logger.
type sandboxLogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

func entryOf(e sandbox.LogEntry) sandboxLogEntry {
	fields := maps.Clone(e.Fields)
	if fields == nil {
		fields = map[string]string{}
	}
	fields["logger"] = e.Logger
	return sandboxLogEntry{Timestamp: e.At, Level: e.Level, Message: e.Message, Fields: fields}
}

func sandboxLine(e sandbox.LogEntry) (time.Time, string, string) { return e.At, e.Level, e.Message }

// Most entries a sandbox log answer has, as E2B.
const maxSandboxLogs = 1000

// sandboxLogs is E2B's v1 sandbox logs (the CLI's e2b sandbox logs):
// from ?start= on, oldest first, each entry also as the JSON line envd
// would have written, which the CLI parses.
func (s *Server) sandboxLogs(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.PathValue("id"))
	if err != nil {
		s.managerError(w, err)
		return
	}
	lq, err := parseLogQuery(r.URL.Query(), "start", 1<<31-1, maxSandboxLogs, false)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	type logLine struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	out := struct {
		Logs       []logLine         `json:"logs"`
		LogEntries []sandboxLogEntry `json:"logEntries"`
	}{Logs: []logLine{}, LogEntries: []sandboxLogEntry{}}
	for _, e := range pick(sb.Logs(), lq, sandboxLine) {
		entry := entryOf(e)
		raw := map[string]string{}
		maps.Copy(raw, entry.Fields)
		raw["timestamp"], raw["level"], raw["message"] = e.At.Format(time.RFC3339Nano), e.Level, e.Message
		line, _ := json.Marshal(raw)
		out.Logs = append(out.Logs, logLine{Timestamp: e.At, Line: string(line)})
		out.LogEntries = append(out.LogEntries, entry)
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxLogsV2 is E2B's v2 sandbox logs: newest first unless
// ?direction=forward, from ?cursor=.
func (s *Server) sandboxLogsV2(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Get(r.PathValue("id"))
	if err != nil {
		s.managerError(w, err)
		return
	}
	lq, err := parseLogQuery(r.URL.Query(), "cursor", maxSandboxLogs, maxSandboxLogs, true)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	out := struct {
		Logs []sandboxLogEntry `json:"logs"`
	}{Logs: []sandboxLogEntry{}}
	for _, e := range pick(sb.Logs(), lq, sandboxLine) {
		out.Logs = append(out.Logs, entryOf(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// Most entries a build log answer has, as E2B.
const maxBuildLogs = 100

func buildLine(e build.LogEntry) (time.Time, string, string) { return e.Timestamp, e.Level, e.Message }

// buildLogs is E2B's template build logs: oldest first unless
// ?direction=backward, from ?cursor=.
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	b, err := s.templates.Builds.Get(r.PathValue("id"), r.PathValue("buildID"))
	if err != nil {
		writeError(w, http.StatusNotFound, "%v", err)
		return
	}
	q := r.URL.Query()
	lq, err := parseLogQuery(q, "cursor", maxBuildLogs, maxBuildLogs, false)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	// One store of logs here: both of E2B's sources are it.
	if v := q.Get("source"); v != "" && v != "temporary" && v != "persistent" {
		writeError(w, http.StatusBadRequest, "source must be temporary or persistent, not %q", v)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Logs []build.LogEntry `json:"logs"`
	}{pick(b.Log(), lq, buildLine)})
}

// buildStatus is a build's state and its log from ?logsOffset= on (of
// the entries of at least ?level=), at most ?limit= (100) of them.
func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	b, err := s.templates.Builds.Get(r.PathValue("id"), r.PathValue("buildID"))
	if err != nil {
		writeError(w, http.StatusNotFound, "%v", err)
		return
	}
	q := r.URL.Query()
	offset := 0
	if v := q.Get("logsOffset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			writeError(w, http.StatusBadRequest, "logsOffset %q is not a count", v)
			return
		}
	}
	lq, err := parseLogQuery(url.Values{"limit": q["limit"], "level": q["level"]}, "", maxBuildLogs, maxBuildLogs, false)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	st := b.Status(offset)
	if lq.minLevel > 0 {
		// The offset counts the entries the level keeps, as E2B's does.
		st = b.Status(0)
		kept := pick(st.LogEntries, logQuery{limit: len(st.LogEntries), minLevel: lq.minLevel}, buildLine)
		st.LogEntries = kept[min(offset, len(kept)):]
	}
	st.LogEntries = st.LogEntries[:min(lq.limit, len(st.LogEntries))]
	st.Logs = []string{}
	for _, e := range st.LogEntries {
		st.Logs = append(st.Logs, e.Line())
	}
	writeJSON(w, http.StatusOK, st)
}
