package rpctest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type echo struct {
	Text string `json:"text"`
}

// TestAgainstRPC: the helpers read what package rpc serves.
func TestAgainstRPC(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/Echo", rpc.Unary(func(ctx context.Context, r *http.Request, req *echo) (*echo, error) {
		if req.Text == "" {
			return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "nothing to echo")
		}
		return req, nil
	}))
	mux.Handle("/Count", rpc.ServerStream(func(ctx context.Context, r *http.Request, req *echo, s *rpc.Stream[echo]) error {
		user, _, _ := r.BasicAuth()
		for _, m := range []string{req.Text, user} {
			if err := s.Send(&echo{m}); err != nil {
				return err
			}
		}
		return rpc.Errorf(agentproto.CodeNotFound, "no more")
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	var out echo
	rpctest.MustUnary(t, srv.URL, "Echo", echo{"hi"}, &out)
	if out.Text != "hi" {
		t.Errorf("Echo: %+v", out)
	}
	if e := rpctest.WantError(t, srv.URL, "Echo", echo{}, "invalid_argument", 400); e.Message != "nothing to echo" {
		t.Errorf("Echo of nothing: %s", e)
	}
	s := rpctest.OpenStream(t, srv.URL, "Count", echo{"one"}, "root")
	for _, want := range []string{"one", "root"} {
		var m echo
		if more, err := s.Next(&m); !more || err != nil || m.Text != want {
			t.Errorf("got %v %v %+v, want %q", more, err, m, want)
		}
	}
	if more, err := s.Next(&out); more || err == nil || err.Code != "not_found" {
		t.Errorf("end: %v %v, want not_found", more, err)
	}
}

// recorder is a testing.TB that records a failure instead of failing
// the test it wraps.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) {
	r.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

// failure runs f with a recorder, on a goroutine of its own (a fatal
// failure ends it), and returns what failed.
func failure(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); f(r) }()
	<-done
	return r.failed
}

// TestHelpersFail: what is not a Connect answer fails the test, saying
// what came instead.
func TestHelpersFail(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/Plain", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "plain text", http.StatusTeapot) })
	mux.HandleFunc("/NotJSON", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{") })
	mux.HandleFunc("/Cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write([]byte{0, 0, 0, 0, 9, '{'})
	})
	mux.Handle("/Echo", rpc.Unary(func(ctx context.Context, r *http.Request, req *echo) (*echo, error) { return req, nil }))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for name, tc := range map[string]struct {
		f    func(tb testing.TB)
		want string
	}{
		"a refusal that is no Connect error": {func(tb testing.TB) { rpctest.Unary(tb, srv.URL, "Plain", echo{}, nil) }, "Plain: 418"},
		"an answer that is no JSON":          {func(tb testing.TB) { rpctest.Unary(tb, srv.URL, "NotJSON", echo{}, &echo{}) }, "NotJSON answered {"},
		"a call that succeeded":              {func(tb testing.TB) { rpctest.WantError(tb, srv.URL, "Echo", echo{"x"}, "not_found", 404) }, "succeeded, want not_found"},
		"a refused call":                     {func(tb testing.TB) { rpctest.MustUnary(tb, srv.URL, "Plain", echo{}, nil) }, "Plain: 418"},
		"a stream that is not one":           {func(tb testing.TB) { rpctest.OpenStream(tb, srv.URL, "Plain", echo{}, "") }, "Plain: 418"},
		"a stream cut off": {func(tb testing.TB) {
			s := rpctest.OpenStream(tb, srv.URL, "Cut", echo{}, "", "X-Extra", "1")
			s.Next(&echo{})
		}, "stream ended without its end"},
	} {
		if got := failure(t, tc.f); !strings.Contains(got, tc.want) {
			t.Errorf("%s: failed with %q, want %q", name, got, tc.want)
		}
	}
	e := &rpctest.Error{Status: 404, Code: "not_found", Message: "gone"}
	if e.String() != "404 not_found: gone" {
		t.Errorf("String: %q", e.String())
	}
}
