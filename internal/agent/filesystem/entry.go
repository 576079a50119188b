package filesystem

import (
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// PathError maps a file-system error to a Connect error naming the path:
// what the client is told, not the error's text alone.
func PathError(path string, err error) *agentproto.Error {
	var e *agentproto.Error
	if errors.As(err, &e) {
		return e
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rpc.Errorf(agentproto.CodeNotFound, "path '%s' does not exist", path)
	case errors.Is(err, fs.ErrExist):
		return rpc.Errorf(agentproto.CodeAlreadyExists, "path '%s' already exists", path)
	case errors.Is(err, fs.ErrPermission):
		return rpc.Errorf(agentproto.CodePermissionDenied, "permission denied: '%s'", path)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return rpc.Errorf(agentproto.CodeResourceExhausted, "no space left writing '%s'", path)
	case errors.Is(err, syscall.ENOTDIR):
		return rpc.Errorf(agentproto.CodeInvalidArgument, "a parent of '%s' is not a directory", path)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return rpc.Errorf(agentproto.CodeInternal, "%s '%s': %v", pe.Op, path, pe.Err)
	}
	return rpc.Errorf(agentproto.CodeInternal, "'%s': %v", path, err)
}

var (
	namesMu sync.Mutex
	names   = map[string]string{}
)

// idName returns the user or group name of an id, from the sandbox's own
// /etc/passwd and /etc/group.
func idName(kind string, id uint32) string {
	key := kind + strconv.FormatUint(uint64(id), 10)
	namesMu.Lock()
	defer namesMu.Unlock()
	if n, ok := names[key]; ok {
		return n
	}
	n := strconv.FormatUint(uint64(id), 10)
	if kind == "u" {
		if u, err := user.LookupId(n); err == nil {
			n = u.Username
		}
	} else if g, err := user.LookupGroupId(n); err == nil {
		n = g.Name
	}
	names[key] = n
	return n
}

// Entry describes path (which Lstat described as fi).
func Entry(path string, fi fs.FileInfo) *agentproto.EntryInfo {
	e := &agentproto.EntryInfo{
		Name:         fi.Name(),
		Path:         path,
		Size:         agentproto.Int64(fi.Size()),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: fi.ModTime().UTC(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = idName("u", st.Uid), idName("g", st.Gid)
	}
	target := fi
	if fi.Mode()&fs.ModeSymlink != 0 {
		if dest, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(filepath.Dir(path), dest)
			}
			e.SymlinkTarget = &dest
		}
		if t, err := os.Stat(path); err == nil {
			target = t
		} else {
			e.Type = agentproto.FileTypeSymlink
			return e
		}
	}
	if target.IsDir() {
		e.Type = agentproto.FileTypeDirectory
	} else {
		e.Type = agentproto.FileTypeFile
	}
	e.Metadata = Metadata(path)
	return e
}

func statEntry(path string) (*agentproto.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, PathError(path, err)
	}
	return Entry(path, fi), nil
}
