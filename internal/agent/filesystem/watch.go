package filesystem

import (
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

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

// filesystemEvent is one change a watcher saw, named relative to the
// watched directory.
type filesystemEvent struct {
	Name  string                `json:"name"`
	Type  eventType             `json:"type"`
	Entry *agentproto.EntryInfo `json:"entry,omitempty"`
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

// watcher reports changes under a directory through inotify, recursively
// if asked: new subdirectories get watches of their own as they appear.
type watcher struct {
	f            *os.File
	root         string
	recursive    bool
	includeEntry bool
	emit         func(filesystemEvent)

	mu  sync.Mutex
	wds map[int]string // watch descriptor → directory
}

func newWatcher(root string, req *watchRequest, emit func(filesystemEvent)) (*watcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, PathError(root, err)
	}
	if !fi.IsDir() {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "path '%s' is not a directory", root)
	}
	// As envd (0.6.4): inotify sees only this machine's changes to a
	// network file system, so watching one must be asked for.
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, PathError(root, err)
	}
	if networkFS(st.Type) && !req.AllowNetworkMounts {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "cannot watch '%s': it is on a network file system (allowNetworkMounts watches it anyway; changes made elsewhere are not seen)", root)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, rpc.Errorf(agentproto.CodeResourceExhausted, "inotify: %v", err)
	}
	w := &watcher{
		f: os.NewFile(uintptr(fd), "inotify"), root: root, recursive: req.Recursive,
		includeEntry: req.IncludeEntry, emit: emit, wds: map[int]string{},
	}
	if err := w.add(root); err != nil {
		w.f.Close()
		return nil, err
	}
	go w.read()
	return w, nil
}

// add watches dir and, when recursive, every directory below it.
func (w *watcher) add(dir string) error {
	wd, err := unix.InotifyAddWatch(int(w.f.Fd()), dir, watchMask)
	if err != nil {
		return PathError(dir, err)
	}
	w.mu.Lock()
	w.wds[wd] = dir
	w.mu.Unlock()
	if !w.recursive {
		return nil
	}
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		if de.IsDir() {
			_ = w.add(filepath.Join(dir, de.Name())) // may vanish meanwhile
		}
	}
	return nil
}

func (w *watcher) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return // closed
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			w.handle(int(ev.Wd), ev.Mask, string(trimNUL(nameBytes)))
		}
	}
}

func (w *watcher) handle(wd int, mask uint32, name string) {
	w.mu.Lock()
	dir, ok := w.wds[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.wds, wd)
	}
	w.mu.Unlock()
	if !ok {
		return
	}
	typ, ok := eventTypeOf(mask)
	if !ok {
		return
	}
	path := filepath.Join(dir, name)
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 && path != w.root {
		return // reported by the parent's watch already
	}
	if w.recursive && mask&unix.IN_ISDIR != 0 && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		_ = w.add(path)
	}
	rel, err := filepath.Rel(w.root, path)
	if err != nil {
		return
	}
	ev := filesystemEvent{Name: rel, Type: typ}
	// Only events whose entry is still at the path carry it: after a
	// remove or rename, a stat could find a newer file made there since.
	if w.includeEntry && (typ == eventCreate || typ == eventWrite || typ == eventChmod) {
		if fi, err := os.Lstat(path); err == nil {
			ev.Entry = Entry(path, fi)
		}
	}
	w.emit(ev)
}

func (w *watcher) Close() { w.f.Close() }

// networkFS says whether a file system type (statfs's f_type) is one that
// envd counts as a network mount: NFS, CIFS, SMB (1 and 2) and FUSE.
func networkFS(fsType int64) bool {
	switch uint32(fsType) {
	case unix.NFS_SUPER_MAGIC, unix.CIFS_SUPER_MAGIC, unix.SMB_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, unix.FUSE_SUPER_MAGIC:
		return true
	}
	return false
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
