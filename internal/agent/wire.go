package agent

import (
	"encoding/json"
	"strconv"
	"time"
)

// The envd messages, as proto3 JSON: lowerCamelCase names, int64 as a
// string, bytes as base64, enums by name, zero values omitted. The schema
// is E2B's process.proto and filesystem.proto (packages "process" and
// "filesystem"); these are Airlock's own definitions of the same wire form.

// int64s is an int64 that proto3 JSON writes as a string and reads either way.
type int64s int64

func (n int64s) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(n), 10) + `"`), nil
}

func (n *int64s) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var v int64
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		*n = int64s(v)
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	*n = int64s(v)
	return err
}

// process.proto

type ptySize struct {
	Cols uint32 `json:"cols,omitempty"`
	Rows uint32 `json:"rows,omitempty"`
}

type ptyConfig struct {
	Size *ptySize `json:"size,omitempty"`
}

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type processInfo struct {
	Config *processConfig `json:"config,omitempty"`
	Pid    uint32         `json:"pid,omitempty"`
	Tag    *string        `json:"tag,omitempty"`
}

type listRequest struct{}

type listResponse struct {
	Processes []processInfo `json:"processes,omitempty"`
}

type startRequest struct {
	Process *processConfig `json:"process"`
	Pty     *ptyConfig     `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

type processSelector struct {
	Pid *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type updateRequest struct {
	Process *processSelector `json:"process"`
	Pty     *ptyConfig       `json:"pty,omitempty"`
}

type empty struct{}

type startEvent struct {
	Pid uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Pty    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

// processEvent is a oneof: exactly one field is set.
type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *empty      `json:"keepalive,omitempty"`
}

// eventResponse is both StartResponse and ConnectResponse.
type eventResponse struct {
	Event *processEvent `json:"event"`
}

type connectRequest struct {
	Process *processSelector `json:"process"`
}

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	Pty   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process *processSelector `json:"process"`
	Input   *processInput    `json:"input"`
}

type sendSignalRequest struct {
	Process *processSelector `json:"process"`
	Signal  string           `json:"signal"`
}

type closeStdinRequest struct {
	Process *processSelector `json:"process"`
}

// filesystem.proto

type fileType string

const (
	fileTypeFile      fileType = "FILE_TYPE_FILE"
	fileTypeDirectory fileType = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   fileType = "FILE_TYPE_SYMLINK"
)

type entryInfo struct {
	Name          string            `json:"name"`
	Type          fileType          `json:"type,omitempty"`
	Path          string            `json:"path"`
	Size          int64s            `json:"size"`
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  time.Time         `json:"modifiedTime"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

type pathRequest struct {
	Path string `json:"path"`
}

type entryResponse struct {
	Entry *entryInfo `json:"entry"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

type listDirResponse struct {
	Entries []*entryInfo `json:"entries"`
}

type watchRequest struct {
	Path         string `json:"path"`
	Recursive    bool   `json:"recursive"`
	IncludeEntry bool   `json:"includeEntry"`
}

type eventType string

const (
	eventCreate eventType = "EVENT_TYPE_CREATE"
	eventWrite  eventType = "EVENT_TYPE_WRITE"
	eventRemove eventType = "EVENT_TYPE_REMOVE"
	eventRename eventType = "EVENT_TYPE_RENAME"
	eventChmod  eventType = "EVENT_TYPE_CHMOD"
)

type filesystemEvent struct {
	Name  string     `json:"name"`
	Type  eventType  `json:"type"`
	Entry *entryInfo `json:"entry,omitempty"`
}

type watchDirResponse struct {
	Start      *empty           `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *empty           `json:"keepalive,omitempty"`
}

type createWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

type watcherRequest struct {
	WatcherID string `json:"watcherId"`
}

type watcherEventsResponse struct {
	Events []filesystemEvent `json:"events"`
}
