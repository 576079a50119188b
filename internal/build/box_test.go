package build

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// A build's steps run through the agent of a sandbox: as root, in a
// sandbox of the build's own user namespace. The agent cannot do that in
// a test's process, so here the box's agent is a recorder that answers
// as the agent does and writes down what each step asked of it.

// call is one request a step made of the agent.
type call struct {
	user string // whom it acts as (envd's Basic authorization)
	// A process: its command line, working directory and environment.
	cmd  string
	cwd  string
	envs map[string]string
	// An untar: where, whether only new, and the entries sent.
	dir     string
	onlyNew bool
	entries []entry
}

// entry is a tar entry as the agent received it.
type entry struct {
	name     string
	uid, gid int
	mode     int64
	kind     byte
	body     string
}

// fakeAgent answers the process and untar requests of a build.
type fakeAgent struct {
	mu    sync.Mutex
	calls []call
	// exit gives a command's exit code and output (nil: 0, "ran CMD\n").
	exit func(cmd string) (int, string)
}

func (a *fakeAgent) take() []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.calls
	a.calls = nil
	return c
}

func (a *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := call{user: userOf(r)}
	switch r.URL.Path {
	case agentproto.StartProcedure:
		_, msg, err := agentproto.ReadEnvelope(r.Body, 1<<20)
		var req agentproto.StartRequest
		if err != nil || json.Unmarshal(msg, &req) != nil || req.Process == nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		c.cmd = strings.Join(append([]string{req.Process.Cmd}, req.Process.Args...), " ")
		c.envs = req.Process.Envs
		if req.Process.Cwd != nil {
			c.cwd = *req.Process.Cwd
		}
		code, out := 0, "ran "+req.Process.Args[len(req.Process.Args)-1]+"\n"
		if a.exit != nil {
			code, out = a.exit(req.Process.Args[len(req.Process.Args)-1])
		}
		w.Header().Set("Content-Type", "application/connect+json")
		send := func(flags byte, v any) {
			b, _ := json.Marshal(v)
			agentproto.WriteEnvelope(w, flags, b)
		}
		send(0, agentproto.StartResponse{Event: &agentproto.ProcessEvent{Start: &agentproto.StartEvent{Pid: 7}}})
		send(0, agentproto.StartResponse{Event: &agentproto.ProcessEvent{Data: &agentproto.DataEvent{Stdout: []byte(out)}}})
		send(0, agentproto.StartResponse{Event: &agentproto.ProcessEvent{End: &agentproto.EndEvent{ExitCode: int32(code), Exited: true}}})
		send(agentproto.FlagEndStream, struct{}{})
	case agentproto.SetupPath + "untar":
		c.dir, c.onlyNew = r.URL.Query().Get("dir"), r.URL.Query().Get("new") == "1"
		tr := tar.NewReader(r.Body)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body, _ := io.ReadAll(tr)
			c.entries = append(c.entries, entry{hdr.Name, hdr.Uid, hdr.Gid, hdr.Mode, hdr.Typeflag, string(body)})
		}
	default:
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	a.mu.Lock()
	a.calls = append(a.calls, c)
	a.mu.Unlock()
}

// userOf is the user of envd's Basic authorization.
func userOf(r *http.Request) string {
	b, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(r.Header.Get("Authorization"), "Basic "))
	u, _, _ := strings.Cut(string(b), ":")
	return u
}

// handlerTransport sends each request to a handler in this process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	w := httptest.NewRecorder()
	t.h.ServeHTTP(w, r)
	return w.Result(), nil
}

// fakeBox is a build's sandbox: its agent is a fakeAgent, and the layer
// it exports holds what layer says.
type fakeBox struct {
	agent  *fakeAgent
	layer  map[string]string
	closed bool
}

func (b *fakeBox) Agent() *agentproto.Client {
	return &agentproto.Client{Transport: handlerTransport{b.agent}}
}

func (b *fakeBox) ExportRoot(_ context.Context, w io.Writer) error {
	tw := tar.NewWriter(w)
	for name, body := range b.layer {
		// Owned by the test's own user: unpacking keeps owners, and only
		// root may give a file away.
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, Uid: os.Getuid(), Gid: os.Getgid()})
		io.WriteString(tw, body)
	}
	return tw.Close()
}

func (b *fakeBox) Close() { b.closed = true }

// fakeHost starts fakeBoxes, or fails with err.
type fakeHost struct {
	agent  *fakeAgent
	layer  map[string]string
	err    error
	boxes  []*fakeBox
	policy policy.Policy // of the last box
}

func (h *fakeHost) StartBox(_ context.Context, p policy.Policy) (Box, error) {
	if h.err != nil {
		return nil, h.err
	}
	h.policy = p
	b := &fakeBox{agent: h.agent, layer: h.layer}
	h.boxes = append(h.boxes, b)
	return b, nil
}

// tarFile is a tar archive of files, name → body; names ending in "/"
// are directories.
func tarFile(files ...string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		name, body := files[i], files[i+1]
		if strings.HasSuffix(name, "/") {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeDir})
			continue
		}
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg, Uid: 1, Gid: 1})
		io.WriteString(tw, body)
	}
	tw.Close()
	return buf.Bytes()
}
