// Package filesystemtest reads the filesystem service's answers as a
// client does, for the tests of the services that give them (filesystem,
// and files, whose uploads set what Stat shows).
package filesystemtest

import (
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc/rpctest"
)

// Entry is an EntryInfo as the client reads it.
type Entry struct {
	Name          string            `json:"name"`
	Type          string            `json:"type"`
	Path          string            `json:"path"`
	Size          string            `json:"size"` // int64, a string in proto3 JSON
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  string            `json:"modifiedTime"`
	SymlinkTarget *string           `json:"symlinkTarget"`
	Metadata      map[string]string `json:"metadata"`
}

// Answer is an answer of one entry (Stat, MakeDir, Move).
type Answer struct {
	Entry Entry `json:"entry"`
}

// Stat is filesystem.Filesystem/Stat of path, which must succeed.
func Stat(t testing.TB, url, path string) Entry {
	t.Helper()
	var r Answer
	rpctest.MustUnary(t, url, "filesystem.Filesystem/Stat", map[string]any{"path": path}, &r)
	return r.Entry
}

// ListDir is filesystem.Filesystem/ListDir of path to depth, which must
// succeed.
func ListDir(t testing.TB, url, path string, depth int) []Entry {
	t.Helper()
	var r struct {
		Entries []Entry `json:"entries"`
	}
	rpctest.MustUnary(t, url, "filesystem.Filesystem/ListDir", map[string]any{"path": path, "depth": depth}, &r)
	return r.Entries
}
