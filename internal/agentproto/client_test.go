package agentproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fakeAgent serves handler and returns a Client of it.
func fakeAgent(t *testing.T, handler http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return &Client{Transport: srv.Client().Transport, URL: srv.URL, Header: http.Header{"X-Access-Token": {"token"}}}
}

// envelopes frames messages, then the end of stream.
func envelopes(end string, msgs ...string) []byte {
	var b bytes.Buffer
	for _, m := range msgs {
		WriteEnvelope(&b, 0, []byte(m))
	}
	if end != "" {
		WriteEnvelope(&b, FlagEndStream, []byte(end))
	}
	return b.Bytes()
}

func TestLimitedBodyFailsPastTheLimit(t *testing.T) {
	big := bytes.Repeat([]byte("x"), MaxResponse+10)
	b := &limitedBody{r: io.LimitReader(bytes.NewReader(big), MaxResponse+1), c: io.NopCloser(nil)}
	n, err := io.Copy(io.Discard, b)
	if !errors.Is(err, ErrTooLarge) || n > MaxResponse {
		t.Fatalf("read %d bytes, err %v; want at most %d and ErrTooLarge", n, err, MaxResponse)
	}
	ok := &limitedBody{r: strings.NewReader("small"), c: io.NopCloser(nil)}
	if data, err := io.ReadAll(ok); err != nil || string(data) != "small" {
		t.Fatalf("small body: %q, %v", data, err)
	}
}

func TestDo(t *testing.T) {
	var got *http.Request
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		got = r
		if r.URL.Query().Get("path") == "big" {
			w.Write(bytes.Repeat([]byte("x"), MaxResponse+10))
			return
		}
		w.Write([]byte("content"))
	})
	resp, err := c.Do(t.Context(), InterpreterPort, "GET", FilesPath+"?path=a", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(data) != "content" {
		t.Errorf("got %q, %v; want content", data, err)
	}
	for k, want := range map[string]string{"E2b-Sandbox-Port": InterpreterPort, "Content-Type": "text/plain", "X-Access-Token": "token"} {
		if v := got.Header.Get(k); v != want {
			t.Errorf("header %s: got %q, want %q", k, v, want)
		}
	}

	resp, err = c.Do(t.Context(), EnvdPort, "GET", FilesPath+"?path=big", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !errors.Is(err, ErrTooLarge) || n > MaxResponse {
		t.Errorf("an oversized body: read %d bytes, err %v; want at most %d and ErrTooLarge", n, err, MaxResponse)
	}
}

// TestFailure: every status but 200 is the agent's refusal, read as an
// *Error whatever shape its body has.
func TestFailure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   Error
	}{
		{"connect error", 404, `{"code":"not_found","message":"path '/x' does not exist"}`, Error{CodeNotFound, "path '/x' does not exist"}},
		{"numeric code", 400, `{"code":400,"message":"give context_id or language, not both"}`, Error{CodeUnknown, "give context_id or language, not both"}},
		{"plain text", 502, "sandbox not found\n", Error{CodeUnknown, "sandbox not found"}},
		{"JSON without a message", 500, `{"code":"internal"}`, Error{CodeUnknown, `{"code":"internal"}`}},
		{"no body", 503, "", Error{CodeUnknown, "503 Service Unavailable"}},
		{"204 is not 200", 204, "", Error{CodeUnknown, "204 No Content"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			})
			_, err := c.Do(t.Context(), EnvdPort, "GET", "/", "", nil)
			var e *Error
			if !errors.As(err, &e) || *e != tc.want {
				t.Errorf("got %#v, want %#v", err, &tc.want)
			}
		})
	}
}

func TestCall(t *testing.T) {
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		var req ListDirRequest
		json.NewDecoder(r.Body).Decode(&req)
		if r.URL.Path != ListDirProcedure || r.Header.Get("Content-Type") != "application/json" ||
			r.Header.Get("E2b-Sandbox-Port") != EnvdPort || req != (ListDirRequest{Path: "/home/user", Depth: 2}) {
			w.WriteHeader(400)
			return
		}
		io.WriteString(w, `{"entries":[{"name":"a","type":"FILE_TYPE_DIRECTORY","path":"/home/user/a","size":"4096","modifiedTime":"2025-01-02T03:04:05Z"}]}`)
	})
	var resp ListDirResponse
	if err := c.Call(t.Context(), ListDirProcedure, ListDirRequest{Path: "/home/user", Depth: 2}, &resp); err != nil {
		t.Fatal(err)
	}
	want := []*EntryInfo{{Name: "a", Type: FileTypeDirectory, Path: "/home/user/a", Size: 4096, ModifiedTime: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}}
	if !reflect.DeepEqual(resp.Entries, want) {
		t.Errorf("got %+v, want %+v", resp.Entries[0], want[0])
	}
}

func TestStream(t *testing.T) {
	start := `{"event":{"start":{"pid":7}}}`
	data := `{"event":{"data":{"stdout":"aGk="}}}`
	end := `{"event":{"end":{"exitCode":1,"exited":true,"status":"exit status 1"}}}`
	for _, tc := range []struct {
		name    string
		body    []byte
		want    int // messages yielded
		wantErr string
	}{
		{"whole stream", envelopes("{}", start, data, end), 3, ""},
		{"ended by an error", envelopes(`{"error":{"code":"deadline_exceeded","message":"too slow"}}`, start), 1, "deadline_exceeded: too slow"},
		{"no end", envelopes("", start), 1, "stream ended without its end"},
		{"cut off", envelopes("{}", start)[:10], 0, "stream ended early: unexpected EOF"},
		{"bad end", envelopes("{", start), 1, "end of stream: unexpected end of JSON input"},
		{"bad message", envelopes("{}", `{"event":{"data":{"stdout":7}}}`), 0, "stream message: json: cannot unmarshal"},
		{"compressed", append([]byte{FlagCompressed, 0, 0, 0, 0}, envelopes("{}")...), 0, "stream ended early: compressed"},
		{"oversized claim", []byte{0, 0xff, 0xff, 0xff, 0xff}, 0, ErrTooLarge.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req StartRequest
			var hdr http.Header
			c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
				hdr = r.Header
				_, msg, _ := ReadEnvelope(r.Body, 1<<20)
				json.Unmarshal(msg, &req)
				w.Write(tc.body)
			})
			sent := StartRequest{Process: &ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "echo hi"}}}
			var got []*StartResponse
			var err error
			for m, e := range Stream[StartResponse](t.Context(), c, StartProcedure, sent, 1500*time.Millisecond) {
				if e != nil {
					err = e
					break
				}
				got = append(got, m)
			}
			if len(got) != tc.want {
				t.Errorf("got %d messages, want %d", len(got), tc.want)
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.wantErr)) {
				t.Errorf("got error %v, want %q", err, tc.wantErr)
			}
			if !reflect.DeepEqual(req, sent) {
				t.Errorf("the agent got %+v, want %+v", req, sent)
			}
			for k, want := range map[string]string{"Content-Type": "application/connect+json", "Connect-Timeout-Ms": "1500", "E2b-Sandbox-Port": EnvdPort} {
				if v := hdr.Get(k); v != want {
					t.Errorf("header %s: got %q, want %q", k, v, want)
				}
			}
			if tc.want == 3 && (got[0].Event.Start.Pid != 7 || string(got[1].Event.Data.Stdout) != "hi" || got[2].Event.End.Status != "exit status 1") {
				t.Errorf("got events %+v %+v %+v", got[0].Event, got[1].Event, got[2].Event)
			}
		})
	}
}

func TestStreamEndErrorIsAnError(t *testing.T) {
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write(envelopes(`{"error":{"code":"not_found","message":"process with pid 3 not found"}}`))
	})
	for _, err := range Stream[StartResponse](t.Context(), c, StartProcedure, StartRequest{}, 0) {
		var e *Error
		if !errors.As(err, &e) || *e != (Error{CodeNotFound, "process with pid 3 not found"}) {
			t.Errorf("got %v, want the agent's *Error", err)
		}
	}
}

// TestStreamStopsEarly: leaving the loop closes the stream at once,
// though the agent would send more.
func TestStreamStopsEarly(t *testing.T) {
	closed := make(chan struct{})
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write(envelopes("", `{"event":{"start":{"pid":1}}}`))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the client went away
		close(closed)
	})
	for m, err := range Stream[StartResponse](t.Context(), c, StartProcedure, StartRequest{}, 0) {
		if err != nil || m.Event.Start == nil {
			t.Fatalf("got %+v, %v", m, err)
		}
		break
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream was not closed")
	}
}
