package agentproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// The daemon's readers of an agent's answers: the agent runs beside the
// sandbox's code and is as untrusted as it.

// answering is a transport whose every response is status with body.
type answering struct {
	status int
	body   []byte
}

func (a answering) RoundTrip(r *http.Request) (*http.Response, error) {
	// Status as net/http's client has it: "404 Not Found".
	return &http.Response{StatusCode: a.status, Status: strings.TrimSpace(fmt.Sprintf("%03d %s", a.status, http.StatusText(a.status))), Header: http.Header{},
		Body: io.NopCloser(bytes.NewReader(a.body)), Request: r}, nil
}

// FuzzStream: a server stream's answer (any bytes) never panics, makes
// the reader allocate at most what it holds plus one bounded message,
// yields at most one message per envelope, and ends at its first error,
// which is the last thing yielded.
func FuzzStream(f *testing.F) {
	for _, body := range [][]byte{
		envelopes(`{}`, `{"event":{"start":{"pid":1}}}`, `{"event":{"data":{"stdout":"aGk="}}}`),
		envelopes(`{"error":{"code":"not_found","message":"x"}}`),
		envelopes(`{"error":{"code":"","message":""}}`), envelopes(`{"error":null}`), envelopes(`not json`),
		envelopes(``, `{"event":{"start":{"pid":1}}}`), envelopes(`{}`, `[]`), envelopes(`{}`, `{"event":{"start":{"pid":-1}}}`),
		{0, 0xff, 0xff, 0xff, 0xff}, {FlagEndStream, 0x7f, 0xff, 0xff, 0xff, '{'}, {FlagCompressed, 0, 0, 0, 0},
		{0, 0, 0, 0, 2, '{', '}'}, {0, 0, 0}, {},
		envelopes(`{}`, `{"event":{"start":`+strings.Repeat(`[`, 10000)+`}}`),
	} {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c := &Client{Transport: answering{http.StatusOK, body}}
		n := allocated(func() {
			msgs, ended := 0, false
			for m, err := range Stream[StartResponse](t.Context(), c, StartProcedure, StartRequest{}, 0) {
				if ended {
					t.Fatalf("%q: yielded after its error", body)
				}
				if err != nil {
					ended = true
					continue
				}
				if m == nil {
					t.Fatalf("%q: a nil message without an error", body)
				}
				if msgs++; msgs > len(body)/5 {
					t.Fatalf("%q: %d messages from %d bytes", body, msgs, len(body))
				}
			}
		})
		if bound := uint64(16*len(body)) + MaxResponse + slack; n > bound {
			t.Errorf("%d bytes of answer allocated %d bytes", len(body), n)
		}
	})
}

// FuzzStreamRoundTrip: the messages an agent sends, and the error its
// stream ends with, reach the daemon as they were sent.
func FuzzStreamRoundTrip(f *testing.F) {
	f.Add(uint32(7), []byte("hi"), []byte("err"), true, "", "")
	f.Add(uint32(0), []byte{}, []byte{0xff}, false, "not_found", "no such file")
	f.Add(uint32(1<<31), []byte("ключ"), []byte(nil), true, "internal", "a\nb\x00")
	f.Add(uint32(1), []byte{0, 1, 2}, []byte("\xff\xfe"), false, "", "message without a code")
	f.Fuzz(func(t *testing.T, pid uint32, stdout, stderr []byte, end bool, code, message string) {
		if !utf8.ValidString(code) || !utf8.ValidString(message) {
			return // JSON strings are UTF-8: an agent cannot send these
		}
		sent := []StartResponse{
			{Event: &ProcessEvent{Start: &StartEvent{Pid: pid}}},
			{Event: &ProcessEvent{Data: &DataEvent{Stdout: stdout, Stderr: stderr}}},
		}
		if end {
			sent = append(sent, StartResponse{Event: &ProcessEvent{End: &EndEvent{ExitCode: int32(pid), Status: message}}})
		}
		var msgs []string
		for _, m := range sent {
			data, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, string(data))
		}
		var stop EndStream
		if code != "" || message != "" {
			stop.Error = &Error{Code: Code(code), Message: message}
		}
		last, _ := json.Marshal(stop)
		c := &Client{Transport: answering{http.StatusOK, envelopes(string(last), msgs...)}}
		var got []StartResponse
		var gotErr error
		for m, err := range Stream[StartResponse](t.Context(), c, StartProcedure, StartRequest{}, 0) {
			if err != nil {
				gotErr = err
				break
			}
			got = append(got, *m)
		}
		want := func(v any) string { data, _ := json.Marshal(v); return string(data) }
		if want(got) != want(sent) {
			t.Errorf("sent %s, got %s", want(sent), want(got))
		}
		var e *Error
		switch {
		case stop.Error == nil && gotErr != nil:
			t.Errorf("a stream that ended well ended with %v", gotErr)
		case stop.Error != nil && (!errors.As(gotErr, &e) || !reflect.DeepEqual(e, stop.Error)):
			t.Errorf("a stream that ended with %+v ended with %v", stop.Error, gotErr)
		}
	})
}

// FuzzFailure: an agent's refusal (any status, any body) reaches the
// daemon as an *Error with a message, no longer than the part of the
// body that is read (each byte at most one replacement character), and
// the agent's own code and message only when it sent them as JSON.
func FuzzFailure(f *testing.F) {
	for _, body := range []string{
		`{"code":"not_found","message":"path '/x' does not exist"}`, `{"code":404,"message":"no such file"}`,
		`{"code":"","message":"x"}`, `{"message":""}`, `plain text refusal` + "\n", ``, `   `, `null`, `{"message":`,
		`{"message":"` + strings.Repeat("\xff", 5000) + `"}`, strings.Repeat("x", 5000), "\x00\xff",
	} {
		f.Add(uint16(300), []byte(body)) // 400
	}
	f.Add(uint16(400), []byte(nil)) // 500
	f.Add(uint16(0), []byte(nil))   // 100
	f.Add(uint16(899), []byte(nil)) // 999
	f.Fuzz(func(t *testing.T, code uint16, body []byte) {
		status := int(code)%900 + 100 // the three digits of an HTTP status
		if status == http.StatusOK {
			return
		}
		c := &Client{Transport: answering{status, body}}
		resp, err := c.Do(t.Context(), EnvdPort, "GET", FilesPath, "", nil)
		var e *Error
		if resp != nil || !errors.As(err, &e) {
			t.Fatalf("status %d answered %v, %v: want an *Error", status, resp, err)
		}
		read := body[:min(len(body), 4096)]
		if e.Message == "" || len(e.Message) > max(3*len(read), 4+len(http.StatusText(status))) {
			t.Errorf("%d %q: message %q", status, body, e.Message)
		}
		var sent struct {
			Code    any    `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(read, &sent) != nil || sent.Message == "" {
			if e.Code != CodeUnknown {
				t.Errorf("%d %q: code %q, want unknown", status, body, e.Code)
			}
			return
		}
		if e.Message != sent.Message {
			t.Errorf("%d %q: message %q, want the agent's %q", status, body, e.Message, sent.Message)
		}
		if code, ok := sent.Code.(string); ok && e.Code != Code(code) || !ok && e.Code != CodeUnknown {
			t.Errorf("%d %q: code %q", status, body, e.Code)
		}
	})
}
