package agentproto

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
)

// request is what a fake agent was sent.
type request struct {
	method, path, query, contentType, port string
	body                                   string
}

// recordingAgent answers every request with status and body, and records
// the request.
func recordingAgent(t *testing.T, status int, body string) (*Client, *request) {
	t.Helper()
	got := &request{}
	c := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		*got = request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("E2b-Sandbox-Port"), string(data)}
		w.WriteHeader(status)
		io.WriteString(w, body)
	})
	return c, got
}

// TestPrivateCalls: each method calls its endpoint as the agent serves
// it, takes its success status, and reads any other as the agent's
// refusal.
func TestPrivateCalls(t *testing.T) {
	for _, tc := range []struct {
		name   string
		call   func(*Client, context.Context) error
		ok     int
		want   request
		refuse string // a refusal's body
	}{
		{"Setup", func(c *Client, ctx context.Context) error {
			return c.Setup(ctx, Setup{EnvVars: map[string]string{"A": "1"}})
		},
			204, request{"POST", SetupEnvPath, "", "application/json", EnvdPort, `{"envVars":{"A":"1"}}`}, "bad setup: EOF\n"},
		{"Checkpoint", (*Client).Checkpoint, 204, request{"POST", CheckpointPath, "", "", EnvdPort, ""},
			"this agent's socket was handed to it: it cannot let go of it\n"},
		{"Settle", (*Client).Settle, 204, request{"POST", SettlePath, "", "", EnvdPort, ""}, "gone\n"},
		{"Reseed", (*Client).Reseed, 204, request{"POST", ReseedPath, "", "", EnvdPort, ""}, "reseed kernel: died\n"},
		{"Untar", func(c *Client, ctx context.Context) error {
			return c.Untar(ctx, "/home/user/a b", true, strings.NewReader("tar"))
		},
			200, request{"POST", UntarPath, "dir=%2Fhome%2Fuser%2Fa+b&new=1", "application/x-tar", EnvdPort, "tar"}, "dir must be an absolute path\n"},
		{"Untar into an existing directory", func(c *Client, ctx context.Context) error { return c.Untar(ctx, "/app", false, strings.NewReader("")) },
			200, request{"POST", UntarPath, "dir=%2Fapp", "application/x-tar", EnvdPort, ""}, "only a sandbox's root can lay out files for others\n"},
		{"RestoreFiles", func(c *Client, ctx context.Context) error { return c.RestoreFiles(ctx, strings.NewReader("saved")) },
			204, request{"POST", SavedFilesPath, "", "application/x-tar", EnvdPort, "saved"}, `entry "etc/passwd" is outside the saved directories` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, got := recordingAgent(t, tc.ok, "")
			if err := tc.call(c, t.Context()); err != nil {
				t.Fatalf("answered %d: %v", tc.ok, err)
			}
			if *got != tc.want {
				t.Errorf("the agent was sent %+v, want %+v", *got, tc.want)
			}
			c, _ = recordingAgent(t, http.StatusBadRequest, tc.refuse)
			err := tc.call(c, t.Context())
			var e *Error
			if !errors.As(err, &e) || e.Message != strings.TrimSpace(tc.refuse) {
				t.Errorf("refused with %q: got %v, want an *Error with its message", tc.refuse, err)
			}
		})
	}
}

// TestPrivateSuccessIsExact: a private endpoint answering the status of
// another is refusing, not succeeding (a gateway's 200 page is no 204).
func TestPrivateSuccessIsExact(t *testing.T) {
	c, _ := recordingAgent(t, http.StatusOK, "<html>")
	if err := c.Checkpoint(t.Context()); err == nil {
		t.Error("Checkpoint answered 200: want an error, the agent lets go of its socket only after a 204")
	}
	c, _ = recordingAgent(t, http.StatusNoContent, "")
	if err := c.Untar(t.Context(), "/", false, nil); err == nil {
		t.Error("Untar answered 204: want an error")
	}
}

func TestDisk(t *testing.T) {
	c, got := recordingAgent(t, 200, `{"used":12345}`)
	d, err := c.Disk(t.Context())
	if err != nil || d.Used != 12345 {
		t.Fatalf("got %+v, %v; want 12345 bytes used", d, err)
	}
	if got.method != "GET" || got.path != DiskPath {
		t.Errorf("sent %s %s, want GET %s", got.method, got.path, DiskPath)
	}
	for _, body := range []string{`{"used":`, `[]`, `{"used":"` + strings.Repeat("9", maxDisk) + `"}`} {
		c, _ := recordingAgent(t, 200, body)
		if d, err := c.Disk(t.Context()); err == nil {
			t.Errorf("answer %.20q: got %+v, want an error", body, d)
		}
	}
	c, _ = recordingAgent(t, 404, "404 page not found\n")
	if _, err := c.Disk(t.Context()); err == nil {
		t.Error("a 404 was taken as an answer")
	}
}

// TestSaveFiles: the stream is copied whole, within the caller's limit
// (not MaxResponse), and only the agent's trailer makes it complete.
func TestSaveFiles(t *testing.T) {
	serve := func(t *testing.T, data []byte, complete bool) *Client {
		return fakeAgent(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != "GET" || r.URL.Path != SavedFilesPath {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Trailer", FilesCompleteTrailer)
			w.Write(data)
			if complete {
				w.Header().Set(FilesCompleteTrailer, "1")
			}
		})
	}
	big := bytes.Repeat([]byte("t"), MaxResponse+100)
	for _, tc := range []struct {
		name     string
		data     []byte
		complete bool
		limit    int64
		want     error
	}{
		{"whole", []byte("tar stream"), true, 100, nil},
		{"exactly the limit", []byte("0123456789"), true, 10, nil},
		{"past the limit", []byte("0123456789!"), true, 10, ErrTooLarge},
		{"larger than MaxResponse", big, true, math.MaxInt64, nil},
		{"no limit given", []byte("x"), true, 0, ErrTooLarge},
		{"incomplete", []byte("tar str"), false, 100, ErrFilesIncomplete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := serve(t, tc.data, tc.complete).SaveFiles(t.Context(), &out, tc.limit)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if err == nil && !bytes.Equal(out.Bytes(), tc.data) {
				t.Errorf("wrote %d bytes, want the %d of the stream", out.Len(), len(tc.data))
			}
		})
	}
	c, _ := recordingAgent(t, http.StatusInternalServerError, "boom\n")
	var e *Error
	if err := c.SaveFiles(t.Context(), io.Discard, 10); !errors.As(err, &e) || e.Message != "boom" {
		t.Errorf("a refusal: got %v, want the agent's *Error", err)
	}
}
