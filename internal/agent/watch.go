package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

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
		return nil, fsError(root, err)
	}
	if !fi.IsDir() {
		return nil, rpc.Errorf(agentproto.CodeInvalidArgument, "path '%s' is not a directory", root)
	}
	// As envd (0.6.4): inotify sees only this machine's changes to a
	// network file system, so watching one must be asked for.
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, fsError(root, err)
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
		return fsError(dir, err)
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
			ev.Entry = entry(path, fi)
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

func (a *Agent) fsWatchDir(ctx context.Context, r *http.Request, req *watchRequest, s *rpc.Stream[watchDirResponse]) error {
	events := make(chan filesystemEvent, 1024)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := newWatcher(a.users.User().Resolve(req.Path), req, func(ev filesystemEvent) {
		select {
		case events <- ev:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return err
	}
	defer w.Close()
	if err := s.Send(&watchDirResponse{Start: &rpc.Empty{}}); err != nil {
		return err
	}
	ka := time.NewTicker(rpc.KeepaliveInterval(r))
	defer ka.Stop()
	for {
		select {
		case ev := <-events:
			if err := s.Send(&watchDirResponse{Filesystem: &ev}); err != nil {
				return err
			}
		case <-ka.C:
			if err := s.Send(&watchDirResponse{Keepalive: &rpc.Empty{}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil // the client stopped watching
		}
	}
}

// newWatcherID is a random id for watchers and interpreter contexts.
func newWatcherID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxPolledEvents bounds what a polling watcher keeps between two polls.
const maxPolledEvents = 10_000

type polledWatcher struct {
	w      *watcher
	mu     sync.Mutex
	events []filesystemEvent
}

func (a *Agent) fsCreateWatcher(ctx context.Context, r *http.Request, req *watchRequest) (*createWatcherResponse, error) {
	id := newWatcherID()
	pw := &polledWatcher{}
	w, err := newWatcher(a.users.User().Resolve(req.Path), req, func(ev filesystemEvent) {
		pw.mu.Lock()
		if len(pw.events) < maxPolledEvents {
			pw.events = append(pw.events, ev)
		}
		pw.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	pw.w = w
	a.watchersMu.Lock()
	a.watchers[id] = pw
	a.watchersMu.Unlock()
	return &createWatcherResponse{WatcherID: id}, nil
}

func (a *Agent) polled(id string) (*polledWatcher, error) {
	a.watchersMu.Lock()
	defer a.watchersMu.Unlock()
	pw, ok := a.watchers[id]
	if !ok {
		return nil, rpc.Errorf(agentproto.CodeNotFound, "watcher %q not found", id)
	}
	return pw, nil
}

func (a *Agent) fsGetWatcherEvents(ctx context.Context, r *http.Request, req *watcherRequest) (*watcherEventsResponse, error) {
	pw, err := a.polled(req.WatcherID)
	if err != nil {
		return nil, err
	}
	pw.mu.Lock()
	defer pw.mu.Unlock()
	resp := &watcherEventsResponse{Events: pw.events}
	if resp.Events == nil {
		resp.Events = []filesystemEvent{}
	}
	pw.events = nil
	return resp, nil
}

func (a *Agent) fsRemoveWatcher(ctx context.Context, r *http.Request, req *watcherRequest) (*rpc.Empty, error) {
	pw, err := a.polled(req.WatcherID)
	if err != nil {
		return nil, err
	}
	pw.w.Close()
	a.watchersMu.Lock()
	delete(a.watchers, req.WatcherID)
	a.watchersMu.Unlock()
	return &rpc.Empty{}, nil
}
