package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// serve serves h in-process and returns its URL.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// post sends body to url with the content type and headers given, and
// returns the status and the body of the answer.
func post(t *testing.T, method, url, contentType string, body []byte, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(data), resp.Header
}

// TestUnary: a request reaches the method as sent and its answer the
// client as JSON; the method's error is a Connect error with its code's
// status.
func TestUnary(t *testing.T) {
	url := serve(t, Unary(func(ctx context.Context, r *http.Request, req *moveRequest) (*entryResponse, error) {
		if req.Destination != "" {
			return nil, Errorf(agentproto.Code(req.Destination), "refused %s", req.Source)
		}
		return &entryResponse{Entry: &agentproto.EntryInfo{Name: req.Source}}, nil
	}))
	code, body, hdr := post(t, "POST", url, "application/json", []byte(`{"source":"a"}`))
	if code != 200 || hdr.Get("Content-Type") != "application/json" || !strings.Contains(body, `"name":"a"`) {
		t.Errorf("success: %d %s %q, want 200 application/json with the entry", code, hdr.Get("Content-Type"), body)
	}
	for c, status := range statuses {
		t.Run(string(c), func(t *testing.T) {
			code, body, _ := post(t, "POST", url, "application/json; charset=utf-8", []byte(`{"source":"x","destination":"`+string(c)+`"}`))
			var e agentproto.Error
			if code != status || json.Unmarshal([]byte(body), &e) != nil || e != (agentproto.Error{Code: c, Message: "refused x"}) {
				t.Errorf("got %d %s, want %d with the error", code, body, status)
			}
		})
	}
}

// TestUnaryRefusals: what is not a Connect JSON call is refused before
// the method runs, with the code that says why.
func TestUnaryRefusals(t *testing.T) {
	var called atomic.Bool
	url := serve(t, Unary(func(ctx context.Context, r *http.Request, req *moveRequest) (*Empty, error) {
		called.Store(true)
		return &Empty{}, nil
	}))
	for _, tc := range []struct {
		name, method, contentType string
		body                      []byte
		hdr                       []string
		want                      agentproto.Code
	}{
		{"GET", "GET", "application/json", nil, nil, agentproto.CodeUnimplemented},
		{"protobuf", "POST", "application/proto", []byte{}, nil, agentproto.CodeUnimplemented},
		{"no content type", "POST", "", []byte(`{}`), nil, agentproto.CodeUnimplemented},
		{"bad JSON", "POST", "application/json", []byte(`{"source":`), nil, agentproto.CodeInvalidArgument},
		{"wrong type", "POST", "application/json", []byte(`{"source":1}`), nil, agentproto.CodeInvalidArgument},
		{"too large", "POST", "application/json", bytes.Repeat([]byte(" "), MaxMessage+1), nil, agentproto.CodeResourceExhausted},
		{"bad timeout", "POST", "application/json", []byte(`{}`), []string{"Connect-Timeout-Ms", "soon"}, agentproto.CodeInvalidArgument},
		{"no timeout left", "POST", "application/json", []byte(`{}`), []string{"Connect-Timeout-Ms", "0"}, agentproto.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			called.Store(false)
			code, body, _ := post(t, tc.method, url, tc.contentType, tc.body, tc.hdr...)
			var e agentproto.Error
			if json.Unmarshal([]byte(body), &e) != nil || e.Code != tc.want || code != statuses[tc.want] || e.Message == "" {
				t.Errorf("got %d %s, want %d %s", code, body, statuses[tc.want], tc.want)
			}
			if called.Load() {
				t.Error("the method ran")
			}
		})
	}
}

// TestUnaryTimeout: Connect-Timeout-Ms is the method's deadline; without
// it the method has none.
func TestUnaryTimeout(t *testing.T) {
	type seen struct {
		deadline time.Time
		has      bool
	}
	deadlines := make(chan seen, 2)
	url := serve(t, Unary(func(ctx context.Context, r *http.Request, req *Empty) (*Empty, error) {
		d, ok := ctx.Deadline()
		deadlines <- seen{d, ok}
		return &Empty{}, nil
	}))
	before := time.Now()
	if code, body, _ := post(t, "POST", url, "application/json", nil, "Connect-Timeout-Ms", "90000"); code != 200 {
		t.Fatalf("got %d %s", code, body)
	}
	s := <-deadlines
	deadline, has := s.deadline, s.has
	if !has || deadline.Before(before.Add(90*time.Second)) || deadline.After(time.Now().Add(90*time.Second)) {
		t.Errorf("deadline %v (set: %v), want 90 s after the call", deadline, has)
	}
	post(t, "POST", url, "application/json", nil)
	if s := <-deadlines; s.has {
		t.Errorf("a call without Connect-Timeout-Ms had the deadline %v", s.deadline)
	}
}
