package filesystem

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// TestPathError: what the client is told of each failure names the
// path it asked for, never more of the error than its kind.
func TestPathError(t *testing.T) {
	own := rpc.Errorf(agentproto.CodeAlreadyExists, "mine")
	for _, tc := range []struct {
		err  error
		want agentproto.Error
	}{
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, agentproto.Error{Code: agentproto.CodeNotFound, Message: "path '/p' does not exist"}},
		{&fs.PathError{Op: "mkdir", Path: "/x", Err: syscall.EEXIST}, agentproto.Error{Code: agentproto.CodeAlreadyExists, Message: "path '/p' already exists"}},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, agentproto.Error{Code: agentproto.CodePermissionDenied, Message: "permission denied: '/p'"}},
		{&fs.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, agentproto.Error{Code: agentproto.CodeResourceExhausted, Message: "no space left writing '/p'"}},
		{syscall.EDQUOT, agentproto.Error{Code: agentproto.CodeResourceExhausted, Message: "no space left writing '/p'"}},
		{&fs.PathError{Op: "stat", Path: "/x", Err: syscall.ENOTDIR}, agentproto.Error{Code: agentproto.CodeInvalidArgument, Message: "a parent of '/p' is not a directory"}},
		{&fs.PathError{Op: "read", Path: "/x", Err: syscall.EIO}, agentproto.Error{Code: agentproto.CodeInternal, Message: "read '/p': input/output error"}},
		{errors.New("odd"), agentproto.Error{Code: agentproto.CodeInternal, Message: "'/p': odd"}},
		{own, *own},
	} {
		if got := PathError("/p", tc.err); *got != tc.want {
			t.Errorf("%v: got %+v, want %+v", tc.err, *got, tc.want)
		}
	}
}

func TestIDName(t *testing.T) {
	if got := idName("u", 0); got != "root" {
		t.Errorf("uid 0: %q, want root", got)
	}
	if got := idName("g", 0); got != "root" {
		t.Errorf("gid 0: %q, want root", got)
	}
	// An id the system does not name is its number.
	if got := idName("u", 4_000_000_000); got != strconv.Itoa(4_000_000_000) {
		t.Errorf("an unnamed uid: %q", got)
	}
	if got := idName("g", 4_000_000_001); got != "4000000001" {
		t.Errorf("an unnamed gid: %q", got)
	}
}

func TestEntryOfADirectory(t *testing.T) {
	dir := t.TempDir()
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := Entry(dir, fi)
	if e.Type != agentproto.FileTypeDirectory || e.Path != dir || e.Permissions != fi.Mode().String() || e.Mode != uint32(fi.Mode().Perm()) {
		t.Errorf("got %+v", e)
	}
}
