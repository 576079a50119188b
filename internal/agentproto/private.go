package agentproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
)

// The agent's private endpoints, under SetupPath: each path is named here
// once, the agent registers it, and the daemon calls it through the
// Client method beside it. They are plain HTTP, not Connect: some carry
// tar streams larger than any message.
const (
	// SetupEnvPath: POST a Setup when the sandbox is handed out; 204.
	SetupEnvPath = SetupPath + "setup"
	// DiskPath: GET a Disk.
	DiskPath = SetupPath + "disk"
	// CheckpointPath: POST; 204, then the agent lets go of its socket
	// until ResumeSignal (a checkpoint cannot keep a host's socket).
	CheckpointPath = SetupPath + "checkpoint"
	// SettlePath: POST; 204 once the kernel the agent prestarts is ready
	// (before a warm snapshot is saved).
	SettlePath = SetupPath + "settle"
	// ReseedPath: POST; 204 once every kernel's random generators are
	// seeded afresh (in each clone of a warm snapshot).
	ReseedPath = SetupPath + "reseed"
	// WarmLatePath: POST; 204 at once, and the agent starts the kernels
	// PrestartLateEnv names in the background (a sandbox put in a pool).
	WarmLatePath = SetupPath + "warm-late"
	// UntarPath: POST a tar stream; 200 once it is written into ?dir=
	// with the owners and modes it carries (a template build's COPY).
	UntarPath = SetupPath + "untar"
	// SavedFilesPath: GET the tar stream of the files a files-only pause
	// keeps (200, FilesCompleteTrailer), or POST one back (204).
	SavedFilesPath = SetupPath + "files"
)

// ErrFilesIncomplete: the agent could not read all of the sandbox's files
// (it logged why), so the stream it sent is not a whole save.
var ErrFilesIncomplete = errors.New("the agent could not read all of the files")

// maxDisk bounds the agent's answer on DiskPath.
const maxDisk = 4 << 10

// private makes a request to a private endpoint that answers 204.
func (c *Client) private(ctx context.Context, path, contentType string, body io.Reader) error {
	resp, err := c.send(ctx, EnvdPort, http.MethodPost, path, contentType, nil, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return failure(resp)
	}
	return nil
}

// Setup gives the agent the sandbox's environment.
func (c *Client) Setup(ctx context.Context, s Setup) error {
	body, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return c.private(ctx, SetupEnvPath, "application/json", bytes.NewReader(body))
}

// Disk is what the sandbox's writable file systems hold.
func (c *Client) Disk(ctx context.Context) (Disk, error) {
	var d Disk
	resp, err := c.send(ctx, EnvdPort, http.MethodGet, DiskPath, "", nil, nil)
	if err != nil {
		return d, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return d, failure(resp)
	}
	err = json.NewDecoder(io.LimitReader(resp.Body, maxDisk)).Decode(&d)
	return d, err
}

// Checkpoint has the agent let go of its socket, and of every connection
// to it, for a checkpoint; the backend's ResumeSignal has it listen again.
func (c *Client) Checkpoint(ctx context.Context) error {
	return c.private(ctx, CheckpointPath, "", nil)
}

// Settle waits until the kernel the agent prestarts, if any, is ready.
func (c *Client) Settle(ctx context.Context) error {
	return c.private(ctx, SettlePath, "", nil)
}

// Reseed seeds the random generators of the agent's kernels afresh.
func (c *Client) Reseed(ctx context.Context) error {
	return c.private(ctx, ReseedPath, "", nil)
}

// WarmLate has the agent start the kernels PrestartLateEnv names, if any,
// in the background.
func (c *Client) WarmLate(ctx context.Context) error {
	return c.private(ctx, WarmLatePath, "", nil)
}

// Untar has the agent, the sandbox's root, write the tar stream into dir
// with the owners and modes its entries carry. onlyNew leaves dir itself
// (the entry ".") as it is if it exists already.
func (c *Client) Untar(ctx context.Context, dir string, onlyNew bool, tar io.Reader) error {
	q := url.Values{"dir": {dir}}
	if onlyNew {
		q.Set("new", "1")
	}
	resp, err := c.Do(ctx, EnvdPort, http.MethodPost, UntarPath+"?"+q.Encode(), "application/x-tar", tar)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// SaveFiles writes to w the tar stream of the files a files-only pause
// keeps, at most limit bytes of it: past them it fails with ErrTooLarge,
// and with ErrFilesIncomplete when the agent could not read them all.
// Unlike other answers, the stream is bounded by limit, not MaxResponse:
// the daemon gives it the sandbox's disk limit.
func (c *Client) SaveFiles(ctx context.Context, w io.Writer, limit int64) error {
	resp, err := c.send(ctx, EnvdPort, http.MethodGet, SavedFilesPath, "", nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return failure(resp)
	}
	limit = min(max(limit, 0), math.MaxInt64-1)
	n, err := io.Copy(w, io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return err
	case n > limit:
		return ErrTooLarge
	case resp.Trailer.Get(FilesCompleteTrailer) != "1":
		return ErrFilesIncomplete
	}
	return nil
}

// RestoreFiles gives a new sandbox's agent the tar stream SaveFiles took
// of an earlier sandbox of its template; an *Error is the agent's refusal.
func (c *Client) RestoreFiles(ctx context.Context, tar io.Reader) error {
	return c.private(ctx, SavedFilesPath, "application/x-tar", tar)
}
