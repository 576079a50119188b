package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// moveRequest and entryResponse are the messages of the fuzzers' method,
// as filesystem.Filesystem/Move has them.
type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type entryResponse struct {
	Entry *agentproto.EntryInfo `json:"entry"`
}

// echoMove is a method for the fuzzers: it answers a moveRequest with an
// entry named by its source, or the error its destination names, and
// records what it was called with.
type echoMove struct {
	called   bool
	req      moveRequest
	ctxErr   error
	deadline time.Time
}

func (e *echoMove) call(ctx context.Context, req *moveRequest) (*entryResponse, error) {
	e.called, e.req, e.ctxErr = true, *req, ctx.Err()
	e.deadline, _ = ctx.Deadline()
	if req.Destination == "fail" {
		return nil, Errorf(agentproto.CodeNotFound, "no %s", req.Source)
	}
	return &entryResponse{Entry: &agentproto.EntryInfo{Name: req.Source}}, nil
}

// checkTimeout fails t unless a call with the Connect-Timeout-Ms header
// timeout, which the server took, got a context that had not ended and
// ends at about that time.
func (e *echoMove) checkTimeout(t *testing.T, timeout string, start time.Time) {
	t.Helper()
	if ms, _ := strconv.ParseInt(timeout, 10, 64); ms > math.MaxInt64/int64(time.Millisecond) {
		return // known overflow (reported)
	}
	if e.ctxErr != nil {
		t.Errorf("Connect-Timeout-Ms %q: the call's context had ended already (%v)", timeout, e.ctxErr)
	}
	ms, err := strconv.ParseInt(timeout, 10, 64)
	if err != nil || ms <= 0 {
		return
	}
	if !e.deadline.After(start) {
		t.Errorf("Connect-Timeout-Ms %q: the call's deadline %v is before the call", timeout, e.deadline)
	}
	if ms <= math.MaxInt64/int64(time.Millisecond) {
		if want := start.Add(time.Duration(ms) * time.Millisecond); e.deadline.Sub(want).Abs() > time.Minute {
			t.Errorf("Connect-Timeout-Ms %q: the call's deadline is %v, want about %v", timeout, e.deadline, want)
		}
	}
}

// decodeMove is the request a body of one envelope carries, as a
// client meant it, if it carries one.
func decodeMove(body []byte) (moveRequest, bool) {
	var req moveRequest
	flags, msg, err := agentproto.ReadEnvelope(bytes.NewReader(body), MaxMessage)
	if err != nil || flags&agentproto.FlagCompressed != 0 {
		return req, false
	}
	if len(msg) > 0 && json.Unmarshal(msg, &req) != nil {
		return req, false
	}
	return req, true
}

func envelope(flags byte, msg string) []byte {
	var b bytes.Buffer
	agentproto.WriteEnvelope(&b, flags, []byte(msg))
	return b.Bytes()
}

// FuzzServerStream: any request to a server stream (body, content type,
// Connect-Timeout-Ms) never panics and is answered with envelopes of
// which exactly the last ends the stream, with {} or an error of a known
// code; the request a valid envelope carries reaches the method as it
// was sent, with a context that has not ended, and its answer reaches
// the client.
func FuzzServerStream(f *testing.F) {
	for _, body := range [][]byte{
		envelope(0, `{"source":"a","destination":"b"}`), envelope(0, `{"source":"a","destination":"fail"}`),
		envelope(0, ``), envelope(0, `{}`), envelope(0, `[]`), envelope(0, `{"source":1}`), envelope(agentproto.FlagCompressed, `{}`),
		envelope(agentproto.FlagEndStream, `{}`), envelope(0, `{"source":"ключ\u0000"}`),
		append(envelope(0, `{"source":"a"}`), envelope(0, `{"source":"b"}`)...),
		{0, 0xff, 0xff, 0xff, 0xff}, {0, 0x01, 0, 0, 0}, {0, 0, 0, 0, 9, '{', '}'}, {}, {0},
		envelope(0, `{"source":`+strings.Repeat(`[`, 10000)+`}`),
	} {
		f.Add(body, "application/connect+json", "")
	}
	for _, timeout := range []string{"1000", "1", "0", "-1", "x", "9223372036854", " 5", "+5"} {
		f.Add(envelope(0, `{"source":"a"}`), "application/connect+json", timeout)
	}
	f.Add(envelope(0, `{}`), "application/json", "")
	f.Add(envelope(0, `{}`), "", "")
	f.Fuzz(func(t *testing.T, body []byte, contentType, timeout string) {
		var e echoMove
		h := ServerStream(func(ctx context.Context, r *http.Request, req *moveRequest, s *Stream[entryResponse]) error {
			resp, err := e.call(ctx, req)
			if err != nil {
				return err
			}
			return s.Send(resp)
		})
		r := httptest.NewRequest("POST", "/filesystem.Filesystem/Move", bytes.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		if timeout != "" {
			r.Header.Set("Connect-Timeout-Ms", timeout)
		}
		w := httptest.NewRecorder()
		start := time.Now()
		h(w, r)

		var msgs []string
		var end agentproto.EndStream
		for {
			flags, msg, err := agentproto.ReadEnvelope(w.Body, MaxMessage)
			if err != nil {
				t.Fatalf("answer to %q: after %q: %v", body, msgs, err)
			}
			if flags&agentproto.FlagEndStream == 0 {
				msgs = append(msgs, string(msg))
				continue
			}
			if err := json.Unmarshal(msg, &end); err != nil {
				t.Fatalf("end of stream %q: %v", msg, err)
			}
			break
		}
		if w.Body.Len() > 0 {
			t.Errorf("%d bytes after the end of the stream", w.Body.Len())
		}
		if end.Error != nil && statuses[end.Error.Code] == 0 {
			t.Errorf("the stream ended with an error of no known code: %+v", end.Error)
		}
		if !e.called {
			if end.Error == nil || len(msgs) > 0 {
				t.Errorf("a stream whose method was never called ended with %q, %+v", msgs, end.Error)
			}
			return
		}
		e.checkTimeout(t, timeout, start)
		if want, ok := decodeMove(body); !ok || want != e.req {
			t.Errorf("the request %q reached the method as %+v, want %+v (%v)", body, e.req, want, ok)
		}
		if e.req.Destination == "fail" {
			if end.Error == nil || end.Error.Code != agentproto.CodeNotFound || len(msgs) > 0 {
				t.Errorf("a failed call ended with %q, %+v", msgs, end.Error)
			}
			return
		}
		var got entryResponse
		if len(msgs) != 1 || json.Unmarshal([]byte(msgs[0]), &got) != nil || got.Entry == nil || got.Entry.Name != e.req.Source || end.Error != nil {
			t.Errorf("the answer to %+v reached the client as %q, %+v", e.req, msgs, end.Error)
		}
	})
}

// FuzzUnary: any unary request (method, content type, body,
// Connect-Timeout-Ms) never panics and is answered 200 with the
// method's answer to the request as sent, or with a Connect error of a
// known code and that code's status.
func FuzzUnary(f *testing.F) {
	for _, body := range []string{
		`{"source":"a","destination":"b"}`, `{"source":"a","destination":"fail"}`, ``, `{}`, `null`, `[]`, `{`,
		`{"source":"a"} trailing`, `{"source":"ключ\u0000😀"}`, `{"Source":"a","SOURCE":"b"}`, `{"source":` + strings.Repeat(`[`, 10000),
	} {
		f.Add("POST", "application/json", []byte(body), "")
	}
	f.Add("GET", "application/json", []byte(`{}`), "")
	f.Add("POST", "application/connect+json", []byte(`{}`), "")
	f.Add("POST", "application/json; charset=utf-8", []byte(`{}`), "500")
	f.Add("POST", "application/json", []byte(`{}`), "9223372036854")
	f.Add("POST", "application/json", []byte(`{}`), "-5")
	f.Fuzz(func(t *testing.T, method, contentType string, body []byte, timeout string) {
		var e echoMove
		h := Unary(func(ctx context.Context, r *http.Request, req *moveRequest) (*entryResponse, error) {
			return e.call(ctx, req)
		})
		r, err := http.NewRequest(method, "/filesystem.Filesystem/Move", bytes.NewReader(body))
		if err != nil {
			return // no client sends it
		}
		r.Header.Set("Content-Type", contentType)
		if timeout != "" {
			r.Header.Set("Connect-Timeout-Ms", timeout)
		}
		w := httptest.NewRecorder()
		start := time.Now()
		h(w, r)
		if w.Code != http.StatusOK {
			var got agentproto.Error
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || statuses[got.Code] != w.Code {
				t.Fatalf("a refusal %d %q: want a Connect error of that status (%v)", w.Code, w.Body, err)
			}
			if e.called && e.req.Destination != "fail" {
				t.Errorf("a call that succeeded was answered %d %q", w.Code, w.Body)
			}
			return
		}
		if !e.called {
			t.Fatalf("answered 200 %q without calling the method", w.Body)
		}
		e.checkTimeout(t, timeout, start)
		var want moveRequest
		if len(body) > 0 {
			if err := json.Unmarshal(body, &want); err != nil {
				t.Fatalf("%q is not a request, and reached the method as %+v", body, e.req)
			}
		}
		var got entryResponse
		if !reflect.DeepEqual(want, e.req) || json.Unmarshal(w.Body.Bytes(), &got) != nil || got.Entry == nil || got.Entry.Name != want.Source {
			t.Errorf("%q reached the method as %+v and was answered %q", body, e.req, w.Body)
		}
	})
}

// FuzzKeepaliveInterval: any Keepalive-Ping-Interval a client sends
// gives a positive interval, which a stream's ticker needs (NewTicker
// panics on any other).
func FuzzKeepaliveInterval(f *testing.F) {
	for _, v := range []string{"", "1", "50", "0", "-1", "x", "9223372036", "1e3", " 5", "+5"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Keepalive-Ping-Interval", v)
		if d := KeepaliveInterval(r); d <= 0 {
			t.Errorf("Keepalive-Ping-Interval %q: interval %v, want a positive one", v, d)
		}
	})
}
