package backend

import (
	"bytes"
	"io"
	"log/slog"
	"sync"
)

// CappedWriter passes at most a limit of bytes to its writer and drops the
// rest, still consuming it, so that a writer in the sandbox never blocks
// on a full pipe.
type CappedWriter struct {
	w         io.Writer
	left      int64
	truncated bool
}

// NewCappedWriter returns a CappedWriter over w (nil: discard).
func NewCappedWriter(w io.Writer, limit int64) *CappedWriter {
	if w == nil {
		w = io.Discard
	}
	return &CappedWriter{w: w, left: limit}
}

func (c *CappedWriter) Write(b []byte) (int, error) {
	n := len(b)
	if int64(len(b)) > c.left {
		b = b[:c.left]
		c.truncated = true
	}
	c.left -= int64(len(b))
	if len(b) > 0 {
		if _, err := c.w.Write(b); err != nil {
			// The reader went away (a closed terminal, say): keep
			// draining so the sandbox is not stalled, but stop writing.
			c.w = io.Discard
		}
	}
	return n, nil
}

// Truncated reports whether anything was dropped.
func (c *CappedWriter) Truncated() bool { return c.truncated }

// LineLog returns a writer that passes what an agent writes to its stderr
// (its own errors, a crash's trace) to log, a line at a time.
func LineLog(log *slog.Logger) io.Writer { return &lineLog{log: log} }

// lineLog may be the writer of two streams (stdout and stderr), copied
// by two goroutines.
type lineLog struct {
	log *slog.Logger
	mu  sync.Mutex
	buf []byte
}

func (l *lineLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) > 4096 { // an endless line: flush what there is
				i = len(l.buf)
			} else {
				return len(b), nil
			}
		}
		l.log.Warn("agent", "line", string(l.buf[:i]))
		l.buf = l.buf[min(i+1, len(l.buf)):]
	}
}
