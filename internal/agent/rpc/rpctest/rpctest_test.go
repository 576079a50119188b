package rpctest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
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
