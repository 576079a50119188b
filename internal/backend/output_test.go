package backend

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

func TestCappedWriter(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int64
		writes    []string
		want      string
		truncated bool
	}{
		{"under the limit", 10, []string{"abc", "def"}, "abcdef", false},
		{"exactly the limit", 6, []string{"abc", "def"}, "abcdef", false},
		{"cut within a write", 4, []string{"abc", "def"}, "abcd", true},
		{"past the limit", 3, []string{"abc", "def", "ghi"}, "abc", true},
		{"no room", 0, []string{"abc"}, "", true},
		{"empty writes", 0, []string{"", ""}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewCappedWriter(&out, tc.limit)
			for _, s := range tc.writes {
				// Every byte is consumed, kept or not: a writer in the
				// sandbox never blocks on a full pipe.
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", s, n, err, len(s))
				}
			}
			if out.String() != tc.want || w.Truncated() != tc.truncated {
				t.Errorf("got %q, truncated %v; want %q, %v", out.String(), w.Truncated(), tc.want, tc.truncated)
			}
		})
	}
}

type failingWriter struct{ writes int }

func (f *failingWriter) Write(b []byte) (int, error) {
	f.writes++
	return 0, errors.New("closed terminal")
}

// A reader that went away is written to no more, and the sandbox's
// output is still consumed; a nil writer discards.
func TestCappedWriterFailingAndNil(t *testing.T) {
	f := &failingWriter{}
	w := NewCappedWriter(f, 100)
	for range 3 {
		if n, err := w.Write([]byte("x")); n != 1 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if f.writes != 1 {
		t.Errorf("%d writes to a failed writer, want 1", f.writes)
	}
	d := NewCappedWriter(nil, 1)
	if n, err := d.Write([]byte("ab")); n != 2 || err != nil || !d.Truncated() {
		t.Errorf("nil writer: %d, %v, truncated %v", n, err, d.Truncated())
	}
}

// lines collects what a logger was told.
type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.got = append(l.got, string(b))
		return len(b), nil
	}), nil))
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestLineLog(t *testing.T) {
	var l lines
	w := LineLog(l.logger())
	for _, s := range []string{"first li", "ne\nsecond\n", "partial"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if len(l.got) != 2 || !strings.Contains(l.got[0], `line="first line"`) || !strings.Contains(l.got[1], "line=second") {
		t.Fatalf("logged %q, want the two whole lines", l.got)
	}
	// An endless line is flushed past 4 KiB rather than held.
	w.Write(bytes.Repeat([]byte("x"), 5000))
	if len(l.got) != 3 || !strings.Contains(l.got[2], "partialxxx") {
		t.Errorf("an endless line: %d entries", len(l.got))
	}
}

// Two streams (stdout and stderr) may share a LineLog.
func TestLineLogConcurrent(t *testing.T) {
	var l lines
	w := LineLog(l.logger())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 100 {
				w.Write([]byte("line\n"))
			}
		})
	}
	wg.Wait()
	if len(l.got) != 200 {
		t.Errorf("%d lines logged, want 200", len(l.got))
	}
}
