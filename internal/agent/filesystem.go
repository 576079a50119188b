package agent

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// The agent runs inside the sandbox, after pivot_root: every path it
// touches is a path of the sandbox, and no symlink planted by sandbox code
// can lead to a host file, because no host file is reachable from here.

// fsError maps a file-system error to a Connect error naming the path.
func fsError(path string, err error) *agentproto.Error {
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

// entry describes path (which Lstat described as fi).
func entry(path string, fi fs.FileInfo) *agentproto.EntryInfo {
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
	e.Metadata = metadataOf(path)
	return e
}

func statEntry(path string) (*agentproto.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fsError(path, err)
	}
	return entry(path, fi), nil
}

func (a *Agent) fsStat(ctx context.Context, r *http.Request, req *pathRequest) (*entryResponse, error) {
	id, err := a.users.Who(r)
	if err != nil {
		return nil, err
	}
	var e *agentproto.EntryInfo
	if err := a.users.As(id, func() (err error) { e, err = statEntry(id.Resolve(req.Path)); return err }); err != nil {
		return nil, err
	}
	return &entryResponse{Entry: e}, nil
}

func (a *Agent) fsMakeDir(ctx context.Context, r *http.Request, req *pathRequest) (*entryResponse, error) {
	id, err := a.users.Who(r)
	if err != nil {
		return nil, err
	}
	p := id.Resolve(req.Path)
	var e *agentproto.EntryInfo
	err = a.users.As(id, func() error {
		if fi, err := os.Stat(p); err == nil {
			if fi.IsDir() {
				return rpc.Errorf(agentproto.CodeAlreadyExists, "directory '%s' already exists", p)
			}
			return rpc.Errorf(agentproto.CodeInvalidArgument, "path '%s' already exists and is not a directory", p)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fsError(p, err)
		}
		e, err = statEntry(p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &entryResponse{Entry: e}, nil
}

func (a *Agent) fsMove(ctx context.Context, r *http.Request, req *moveRequest) (*entryResponse, error) {
	id, err := a.users.Who(r)
	if err != nil {
		return nil, err
	}
	src, dst := id.Resolve(req.Source), id.Resolve(req.Destination)
	var e *agentproto.EntryInfo
	err = a.users.As(id, func() error {
		if _, err := os.Lstat(src); err != nil {
			return fsError(src, err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fsError(filepath.Dir(dst), err)
		}
		if err := os.Rename(src, dst); err != nil {
			return fsError(dst, err)
		}
		e, err = statEntry(dst)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &entryResponse{Entry: e}, nil
}

func (a *Agent) fsRemove(ctx context.Context, r *http.Request, req *pathRequest) (*rpc.Empty, error) {
	id, err := a.users.Who(r)
	if err != nil {
		return nil, err
	}
	p := id.Resolve(req.Path)
	// As envd: removing what is not there succeeds.
	err = a.users.As(id, func() error {
		if err := os.RemoveAll(p); err != nil {
			return fsError(p, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &rpc.Empty{}, nil
}

// maxListEntries bounds one ListDir answer; a sandbox can hold millions of
// files and the answer is one JSON message.
const maxListEntries = 100_000

func (a *Agent) fsListDir(ctx context.Context, r *http.Request, req *agentproto.ListDirRequest) (*agentproto.ListDirResponse, error) {
	id, err := a.users.Who(r)
	if err != nil {
		return nil, err
	}
	var resp *agentproto.ListDirResponse
	err = a.users.As(id, func() (err error) { resp, err = a.listDir(ctx, id.Resolve(req.Path), req); return err })
	return resp, err
}

func (a *Agent) listDir(ctx context.Context, root string, req *agentproto.ListDirRequest) (*agentproto.ListDirResponse, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fsError(root, err)
	}
	if !fi.IsDir() {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "path '%s' is not a directory", root)
	}
	depth := int(req.Depth)
	if depth < 1 {
		depth = 1
	}
	resp := &agentproto.ListDirResponse{Entries: []*agentproto.EntryInfo{}}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		des, err := os.ReadDir(dir)
		if err != nil {
			return fsError(dir, err)
		}
		for _, de := range des {
			if err := ctx.Err(); err != nil {
				return err
			}
			if len(resp.Entries) >= maxListEntries {
				return rpc.Errorf(agentproto.CodeResourceExhausted, "more than %d entries under '%s'", maxListEntries, root)
			}
			p := filepath.Join(dir, de.Name())
			info, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			resp.Entries = append(resp.Entries, entry(p, info))
			if de.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, err
	}
	return resp, nil
}

// inotify events the watchers ask for, and how they map to envd's types.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_CLOSE_WRITE |
	unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVE_SELF | unix.IN_ATTRIB

func eventTypeOf(mask uint32) (eventType, bool) {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return eventCreate, true
	case mask&unix.IN_MODIFY != 0:
		return eventWrite, true
	case mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
		return eventRemove, true
	case mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0:
		return eventRename, true
	case mask&unix.IN_ATTRIB != 0:
		return eventChmod, true
	}
	return "", false
}
