package agentproto

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// RunPath: POST a stream of frames, a FrameRequest with a RunRequest
// first, then the command's stdin (FrameStdin, FrameStdinEnd) where it
// asked for it; the agent answers 200 and a stream of frames: the
// command's FrameStarted, FrameStdout and FrameStderr, and its
// FrameExit, or a FrameSetupError if it could not start. It is airlock
// run's one-shot command in a pooled sandbox: nothing of envd's process
// bookkeeping, and the end the direct path has (background children die
// with the command).
const RunPath = SetupPath + "run"

// Frame types, of RunPath and of airlock run's socket (package runsock).
// A frame is its type, its payload's length (4 bytes, big-endian) and its
// payload.
const (
	FrameRequest    byte = 'R' // a JSON request
	FrameStdin      byte = 'I'
	FrameStdinEnd   byte = 'Z'
	FrameStarted    byte = 'S'
	FrameStdout     byte = 'O'
	FrameStderr     byte = 'E'
	FrameExit       byte = 'X' // RunExit, as JSON
	FrameSetupError byte = 'F' // the command did not start: why, as text
)

// MaxFrame bounds a frame's payload; a request is a frame too.
const MaxFrame = 1 << 20

// RunRequest is the command RunPath starts, as airlock run's direct path
// would: the environment verbatim, the working directory absolute.
type RunRequest struct {
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	Umask uint32   `json:"umask"`
	Stdin bool     `json:"stdin"`
	// Pids, if set, is the command's RLIMIT_NPROC, below the sandbox's
	// (a pooled sandbox handed out under a lower pids limit).
	Pids int64 `json:"pids,omitempty"`
	// FileSize, if set, is its RLIMIT_FSIZE: the disk limit, as the
	// direct path's.
	FileSize int64 `json:"fileSize,omitempty"`
}

// RunExit is how the command ended: its raw wait status, as wait(2) gave
// it (syscall.WaitStatus), so that the daemon tells exits from signals as
// the direct path's init reports them.
type RunExit struct {
	WaitStatus uint32 `json:"waitStatus"`
}

// WriteFrame writes one frame. The reader bounds what it takes
// (ReadFrame's limit).
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if int64(len(payload)) > math.MaxUint32 {
		return fmt.Errorf("frame of %d bytes is over the limit", len(payload))
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) < 4096 {
		// One write: a small frame in one packet, one syscall.
		_, err := w.Write(append(hdr[:], payload...))
		return err
	}
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// WriteJSONFrame writes v as one frame's JSON payload.
func WriteJSONFrame(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, typ, b)
}

// ReadFrame reads one frame whose payload is at most limit bytes. A
// stream that ends between frames is io.EOF; one that ends inside a
// frame is io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, limit int) (typ byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if int64(n) > int64(limit) {
		return 0, nil, fmt.Errorf("frame of %d bytes is over the limit of %d", n, limit)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[0], payload, nil
}

// DecodeStrict decodes one JSON value that must hold only the fields v
// has.
func DecodeStrict(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// Run starts req on RunPath and returns the agent's stream of frames.
// stdin, when req asks for it, is sent as the command reads it; its end
// closes the command's stdin. The caller reads the answer with ReadFrame
// and closes it.
func (c *Client) Run(ctx context.Context, req RunRequest, stdin io.Reader) (io.ReadCloser, error) {
	pr, pw := io.Pipe()
	go func() {
		err := WriteJSONFrame(pw, FrameRequest, req)
		if err == nil && req.Stdin && stdin != nil {
			err = CopyStdin(pw, stdin)
		}
		pw.CloseWithError(err)
	}()
	resp, err := c.send(ctx, EnvdPort, http.MethodPost, RunPath, "application/octet-stream", nil, pr)
	if err != nil {
		pr.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		pr.Close()
		return nil, failure(resp)
	}
	return resp.Body, nil
}

// CopyStdin sends what r holds as FrameStdin frames, then FrameStdinEnd.
func CopyStdin(w io.Writer, r io.Reader) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := WriteFrame(w, FrameStdin, buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return WriteFrame(w, FrameStdinEnd, nil)
		}
		if err != nil {
			return err
		}
	}
}

// LookPath resolves a command name with the PATH of env, in the root the
// caller sees: airlock run's command, found the same way by the namespaces
// sandbox's init (run directly) and by the agent (RunPath).
func LookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathEnv := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in the sandbox", name)
}
