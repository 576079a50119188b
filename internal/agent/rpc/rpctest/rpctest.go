// Package rpctest calls the agent's Connect services from tests, as the
// SDKs do: unary calls and server streams over HTTP, with the status
// and the Connect error of every refusal.
package rpctest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Error is a Connect error as the client received it.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) String() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Unary calls a unary method (url+"/"+method) with req as JSON. On 200 it
// decodes the answer into out (unless nil) and returns nil; otherwise it
// returns the error, failing t if the refusal is no Connect error.
func Unary(t testing.TB, url, method string, req, out any) *Error {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+"/"+method, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &Error{Status: resp.StatusCode}
		if err := json.Unmarshal(data, e); err != nil || e.Code == "" {
			t.Fatalf("%s: %d with body %q, want a Connect error", method, resp.StatusCode, data)
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s answered %s: %v", method, data, err)
		}
	}
	return nil
}

// MustUnary is Unary that fails t on an error.
func MustUnary(t testing.TB, url, method string, req, out any) {
	t.Helper()
	if e := Unary(t, url, method, req, out); e != nil {
		t.Fatalf("%s %v: %s", method, req, e)
	}
}

// WantError calls method and checks that it fails with code and status.
func WantError(t testing.TB, url, method string, req any, code string, status int) *Error {
	t.Helper()
	e := Unary(t, url, method, req, nil)
	if e == nil {
		t.Fatalf("%s %v succeeded, want %s", method, req, code)
	}
	if e.Code != code || e.Status != status {
		t.Errorf("%s %v: %s, want %d %s", method, req, e, status, code)
	}
	return e
}

// Stream is the client side of a server-streaming call.
type Stream struct {
	t    testing.TB
	body io.ReadCloser
}

// OpenStream calls a server-streaming method with req, as the user named
// (none if ""), with the headers given in pairs.
func OpenStream(t testing.TB, url, method string, req any, user string, hdr ...string) *Stream {
	t.Helper()
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	agentproto.WriteEnvelope(&body, 0, data)
	hreq, err := http.NewRequestWithContext(t.Context(), "POST", url+"/"+method, &body)
	if err != nil {
		t.Fatal(err)
	}
	hreq.Header.Set("Content-Type", "application/connect+json")
	if user != "" {
		hreq.SetBasicAuth(user, "")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		hreq.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("%s: %d %s, want 200 application/connect+json", method, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return &Stream{t: t, body: resp.Body}
}

// Next decodes the next message into out; at the end of the stream it
// returns false and the end's error, if any.
func (s *Stream) Next(out any) (bool, *Error) {
	s.t.Helper()
	flags, msg, err := agentproto.ReadEnvelope(s.body, agentproto.MaxResponse)
	if err != nil {
		s.t.Fatalf("stream ended without its end: %v", err)
	}
	if flags&agentproto.FlagEndStream != 0 {
		var end struct {
			Error *Error `json:"error"`
		}
		if err := json.Unmarshal(msg, &end); err != nil {
			s.t.Fatalf("end of stream %q: %v", msg, err)
		}
		return false, end.Error
	}
	if err := json.Unmarshal(msg, out); err != nil {
		s.t.Fatalf("message %q: %v", msg, err)
	}
	return true, nil
}

// Close ends the call early.
func (s *Stream) Close() { s.body.Close() }
