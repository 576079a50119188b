package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestServerStreamFrames: every message in an envelope, then an
// end-of-stream envelope holding exactly {} or the error.
func TestServerStreamFrames(t *testing.T) {
	echo := ServerStream(func(ctx context.Context, r *http.Request, req *agentproto.StartRequest, s *Stream[agentproto.StartResponse]) error {
		if req.Process == nil {
			return Errorf(agentproto.CodeInvalidArgument, "no command")
		}
		return s.Send(&agentproto.StartResponse{Event: &agentproto.ProcessEvent{Start: &agentproto.StartEvent{Pid: 7}}})
	})
	envelope := func(flags byte, msg string) []byte {
		var b bytes.Buffer
		agentproto.WriteEnvelope(&b, flags, []byte(msg))
		return b.Bytes()
	}
	start := `{"event":{"start":{"pid":7}}}`
	for _, tc := range []struct {
		name string
		body []byte
		want []string // the messages, the end's last
	}{
		{"success", envelope(0, `{"process":{"cmd":"true"}}`), []string{start, `{}`}},
		{"error", envelope(0, `{}`), []string{`{"error":{"code":"invalid_argument","message":"no command"}}`}},
		{"compressed", envelope(agentproto.FlagCompressed, `{}`), []string{`{"error":{"code":"unimplemented","message":"compressed messages are not supported"}}`}},
		{"too large", []byte{0, 0xff, 0, 0, 0}, []string{`{"error":{"code":"resource_exhausted","message":"request larger than 16777216 bytes"}}`}},
		{"cut off", envelope(0, `{"process":{}}`)[:8], []string{`{"error":{"code":"invalid_argument","message":"read request: unexpected EOF"}}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("POST", agentproto.StartProcedure, bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/connect+json")
			w := httptest.NewRecorder()
			echo(w, req)
			var got []string
			for {
				flags, msg, err := agentproto.ReadEnvelope(w.Body, 1<<20)
				if err != nil {
					t.Fatalf("after %q: %v", got, err)
				}
				got = append(got, string(msg))
				if flags&agentproto.FlagEndStream != 0 {
					break
				}
			}
			if w.Body.Len() > 0 {
				t.Errorf("%d bytes after the end of the stream", w.Body.Len())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("message %d: got %s, want %s", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestServerStreamFlushes: each message reaches the client as it is
// sent, while the method still runs.
func TestServerStreamFlushes(t *testing.T) {
	release := make(chan struct{})
	url := serve(t, ServerStream(func(ctx context.Context, r *http.Request, req *Empty, s *Stream[agentproto.StartEvent]) error {
		if err := s.Send(&agentproto.StartEvent{Pid: 1}); err != nil {
			return err
		}
		<-release // until the client has read the first message
		return s.Send(&agentproto.StartEvent{Pid: 2})
	}))
	var body bytes.Buffer
	agentproto.WriteEnvelope(&body, 0, []byte(`{}`))
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url, &body)
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, first, err := agentproto.ReadEnvelope(resp.Body, 1<<10)
	close(release)
	if err != nil || string(first) != `{"pid":1}` {
		t.Fatalf("first message %q, %v", first, err)
	}
	for _, want := range []string{`{"pid":2}`, `{}`} {
		if _, msg, err := agentproto.ReadEnvelope(resp.Body, 1<<10); err != nil || string(msg) != want {
			t.Errorf("got %q, %v; want %s", msg, err, want)
		}
	}
}

// TestServerStreamRefusals: what is not a Connect streaming call ends
// the stream at once with the code that says why.
func TestServerStreamRefusals(t *testing.T) {
	url := serve(t, ServerStream(func(ctx context.Context, r *http.Request, req *Empty, s *Stream[Empty]) error {
		t.Error("the method ran")
		return nil
	}))
	var ok bytes.Buffer
	agentproto.WriteEnvelope(&ok, 0, []byte(`{}`))
	for _, tc := range []struct {
		name, method, contentType string
		hdr                       []string
		want                      agentproto.Code
	}{
		{"GET", "GET", "application/connect+json", nil, agentproto.CodeUnimplemented},
		{"unary content type", "POST", "application/json", nil, agentproto.CodeUnimplemented},
		{"bad timeout", "POST", "application/connect+json", []string{"Connect-Timeout-Ms", "-1"}, agentproto.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, hdr := post(t, tc.method, url, tc.contentType, ok.Bytes(), tc.hdr...)
			flags, msg, err := agentproto.ReadEnvelope(strings.NewReader(body), 1<<10)
			var end agentproto.EndStream
			if code != 200 || hdr.Get("Content-Type") != "application/connect+json" || err != nil || flags != agentproto.FlagEndStream ||
				json.Unmarshal(msg, &end) != nil || end.Error == nil || end.Error.Code != tc.want {
				t.Errorf("got %d %q, want one end of stream with %s", code, body, tc.want)
			}
		})
	}
}
