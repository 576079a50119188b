package agent

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestServerStreamFrames: every message in an envelope, then an
// end-of-stream envelope holding exactly {} or the error.
func TestServerStreamFrames(t *testing.T) {
	echo := serverStream(func(ctx context.Context, r *http.Request, req *agentproto.StartRequest, s *stream[agentproto.StartResponse]) error {
		if req.Process == nil {
			return errorf(agentproto.CodeInvalidArgument, "no command")
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
