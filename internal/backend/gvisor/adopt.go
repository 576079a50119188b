package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/cgroups"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

// Live restore: with a keeper (SetKeeper), runsc is started as the
// keeper's child rather than this process's, so that the sandbox
// outlives the daemon; the keeper holds beside it the agent's log pipe,
// the bundle's lock (a Cleanup then leaves the bundle alone), the agent
// directory's descriptor and the network namespace. A later daemon's
// Adopt takes them back under the bundle's id.

var (
	_ backend.Adopter   = (*Backend)(nil)
	_ backend.Adoptable = (*agentSandbox)(nil)
)

// keptTag is what a keeper knows a gVisor sandbox by.
const keptTag = "gvisor/"

// keptInfo is what a keeper keeps of a sandbox beside its files: its
// log's read end, its bundle's lock, its agent directory, and its
// network namespace if NetNS.
type keptInfo struct {
	Root  bool    // its agent runs as its root (newAgentSandbox)
	CPUs  float64 // its cgroup's CPU limit, which a restore sets back
	NetNS bool
}

// SetKeeper makes k the keeper that holds the sandboxes earlier
// processes left running; with alive, this process's sandboxes are
// started through it, to outlive it too. Call it before any sandbox
// starts.
func (be *Backend) SetKeeper(k backend.Keeper, alive bool) {
	be.keeper, be.keepAlive = k, alive
}

// keep has the keeper hold what a later process needs of s, beside its
// runsc: see keptInfo.
func (s *agentSandbox) keep(logR *os.File) error {
	info, _ := json.Marshal(keptInfo{Root: s.agent.uid == 0, CPUs: s.b.limits.CPUs, NetNS: s.b.netns != nil})
	fd, err := unix.FcntlInt(uintptr(s.agent.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	agent := os.NewFile(uintptr(fd), "agent")
	defer agent.Close()
	files := []*os.File{logR, s.b.lock, agent}
	if s.b.netns != nil {
		files = append(files, s.b.netns)
	}
	return s.kept.Keep(keptTag+s.b.id, info, files)
}

// Handle names the sandbox for a later process's Adopt; "" if it dies
// with this process.
func (s *agentSandbox) Handle() string {
	if s.kept == nil {
		return ""
	}
	return s.b.id
}

// Adopt takes back the sandbox whose bundle is handle, which a keeper
// holds: its runsc, its agent reached again through the directory the
// keeper kept, its log through the pipe, and netns, its network
// namespace, if it has one.
func (be *Backend) Adopt(_ context.Context, handle string) (backend.Instance, *os.File, error) {
	if be.keeper == nil || !backend.IsBoxID(handle) {
		return nil, nil, fmt.Errorf("no running sandbox %s was kept", handle)
	}
	proc, raw, files := be.keeper.TakeKept(keptTag + handle)
	if proc == nil {
		return nil, nil, fmt.Errorf("no running sandbox %s was kept", handle)
	}
	return be.adopted(handle, proc, raw, files)
}

// adopted is the sandbox of bundle id that a keeper kept.
func (be *Backend) adopted(id string, proc backend.KeptProcess, raw []byte, files []*os.File) (*agentSandbox, *os.File, error) {
	var info keptInfo
	want := 3
	err := json.Unmarshal(raw, &info)
	if info.NetNS {
		want++
	}
	if err != nil || len(files) != want {
		backend.CloseAll(files)
		proc.Signal(syscall.SIGKILL)
		proc.Wait()
		b := &bundle{id: id, dir: filepath.Join(be.stateDir, "bundles", id), stateDir: be.stateDir, cg: cgroups.Load(cgroups.Prefix + id)}
		s := &agentSandbox{b: b}
		if s.isSaved() {
			b.release(be.runsc) // a restore not yet taken: its saved state stays
		} else {
			b.remove(be.runsc)
		}
		return nil, nil, fmt.Errorf("sandbox %s: its keeper held %d files (%v), not %d", id, len(files), err, want)
	}
	logR, lock, agentFile := backend.Pollable(files[0]), files[1], files[2]
	b := &bundle{id: id, dir: filepath.Join(be.stateDir, "bundles", id), stateDir: be.stateDir, lock: lock, cg: cgroups.Load(cgroups.Prefix + id)}
	b.limits.CPUs = info.CPUs
	if info.CPUs > 0 {
		// Its own quota: a restore's boost (checkpoint.go) may not have
		// been set back when its daemon died.
		b.cg.SetCPUs(info.CPUs)
	}
	var netns *os.File
	if info.NetNS {
		netns = files[3]
		b.netns = netns
	}
	uid := layout.UID
	if info.Root {
		uid = 0
	}
	fd, err := unix.FcntlInt(agentFile.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	agentFile.Close()
	if err != nil {
		fd = -1
	}
	b.agent = &agentDir{path: b.agentDir(), fd: fd, uid: uid, inSandbox: b.cg.Holds}
	failure := &runscFailure{done: make(chan struct{})}
	close(failure.done) // what runsc said went to the daemon that started it
	s := &agentSandbox{be: be, runsc: be.runsc, log: be.log, b: b, agent: b.agent, kept: proc, failure: failure, done: make(chan struct{})}
	log := backend.LineLog(be.log)
	go func() { io.Copy(log, logR); logR.Close() }()
	go func() {
		proc.Wait()
		close(s.done)
	}()
	if fd < 0 {
		s.Kill(context.Background())
		s.Wait()
		if netns != nil {
			netns.Close()
		}
		return nil, nil, errors.New("sandbox " + id + ": its agent's directory")
	}
	return s, netns, nil
}

// DropUnadopted kills and removes the kept sandboxes no Adopt took.
func (be *Backend) DropUnadopted() {
	if be.keeper == nil {
		return
	}
	for _, tag := range be.keeper.KeptTags(keptTag) {
		id := strings.TrimPrefix(tag, keptTag)
		proc, raw, files := be.keeper.TakeKept(tag)
		if proc == nil {
			continue
		}
		if !backend.IsBoxID(id) {
			proc.Signal(syscall.SIGKILL)
			proc.Wait()
			backend.CloseAll(files)
			continue
		}
		be.log.Info("a kept sandbox no one adopted is removed", "sandbox", id)
		if s, netns, err := be.adopted(id, proc, raw, files); err == nil {
			s.Kill(context.Background())
			s.Wait()
			if netns != nil {
				netns.Close()
			}
		}
	}
}
