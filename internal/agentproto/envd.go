package agentproto

import (
	"encoding/json"
	"strconv"
	"time"
)

// The envd messages the daemon sends or reads, as proto3 JSON:
// lowerCamelCase names, int64 as a string, bytes as base64, enums by name,
// zero values omitted. The schema is E2B's process.proto and
// filesystem.proto (packages "process" and "filesystem"); these are
// Airlock's own definitions of the same wire form. The rest of the schema
// is the agent's alone (internal/agent/wire.go).

// What the daemon calls of envd: two Connect procedures, and plain HTTP
// on FilesPath (GET ?path= answers the file's bytes, POST ?path= with an
// application/octet-stream body writes it).
const (
	StartProcedure   = "/process.Process/Start"
	ListDirProcedure = "/filesystem.Filesystem/ListDir"
	FilesPath        = "/files"
)

// Int64 is an int64 that proto3 JSON writes as a string and reads either way.
type Int64 int64

func (n Int64) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(n), 10) + `"`), nil
}

func (n *Int64) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var v int64
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		*n = Int64(v)
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	*n = Int64(v)
	return err
}

// StartRequest starts a process (process.Process/Start, a server stream
// of StartResponse).
type StartRequest struct {
	Process *ProcessConfig `json:"process"`
	Pty     *PTY           `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	// Stdin says whether the process gets an open stdin; absent (older
	// SDKs) means it does.
	Stdin *bool `json:"stdin,omitempty"`
}

// ProcessConfig is the command a process runs.
type ProcessConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// PTY asks for a pseudo-terminal instead of pipes.
type PTY struct {
	Size *PTYSize `json:"size,omitempty"`
}

// PTYSize is a terminal's size in characters.
type PTYSize struct {
	Cols uint32 `json:"cols,omitempty"`
	Rows uint32 `json:"rows,omitempty"`
}

// StartResponse is one message of a Start (or Connect) stream.
type StartResponse struct {
	Event *ProcessEvent `json:"event"`
}

// ProcessEvent is a oneof: exactly one field is set. A stream sends Start
// first, then Data and Keepalive, and End last.
type ProcessEvent struct {
	Start     *StartEvent `json:"start,omitempty"`
	Data      *DataEvent  `json:"data,omitempty"`
	End       *EndEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

// StartEvent says the process started.
type StartEvent struct {
	Pid uint32 `json:"pid"`
}

// DataEvent is a chunk of output: one of the three is set.
type DataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Pty    []byte `json:"pty,omitempty"`
}

// EndEvent says how the process ended.
type EndEvent struct {
	ExitCode int32 `json:"exitCode"`
	Exited   bool  `json:"exited"`
	// Status is how it ended, as Go's os.ProcessState says it
	// ("exit status 1", "signal: killed").
	Status string  `json:"status"`
	Error  *string `json:"error,omitempty"`
}

// ListDirRequest lists a directory (filesystem.Filesystem/ListDir).
type ListDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

// ListDirResponse is ListDir's answer.
type ListDirResponse struct {
	Entries []*EntryInfo `json:"entries"`
}

// FileType is an entry's type, an enum by name.
type FileType string

const (
	FileTypeFile      FileType = "FILE_TYPE_FILE"
	FileTypeDirectory FileType = "FILE_TYPE_DIRECTORY"
	FileTypeSymlink   FileType = "FILE_TYPE_SYMLINK"
)

// EntryInfo describes a file system entry.
type EntryInfo struct {
	Name          string            `json:"name"`
	Type          FileType          `json:"type,omitempty"`
	Path          string            `json:"path"`
	Size          Int64             `json:"size"`
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  time.Time         `json:"modifiedTime"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}
