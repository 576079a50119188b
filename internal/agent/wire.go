package agent

import (
	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// The envd messages only the agent reads or writes, in the wire form of
// those the daemon shares (agentproto's envd.go says what that form is).

// filesystem.proto

type pathRequest struct {
	Path string `json:"path"`
}

type entryResponse struct {
	Entry *agentproto.EntryInfo `json:"entry"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type watchRequest struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive"`
	IncludeEntry       bool   `json:"includeEntry"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts"`
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
	Name  string                `json:"name"`
	Type  eventType             `json:"type"`
	Entry *agentproto.EntryInfo `json:"entry,omitempty"`
}

type watchDirResponse struct {
	Start      *rpc.Empty       `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *rpc.Empty       `json:"keepalive,omitempty"`
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
