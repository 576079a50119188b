package agent

import (
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// identity is who a request acts as inside the sandbox.
type identity struct {
	name     string
	uid, gid int
	home     string
}

var (
	sandboxUser = identity{"user", 1000, 1000, "/home/user"}
	rootUser    = identity{"root", 0, 0, "/root"}
)

// who returns the identity a request asks for (envd names it in Basic
// authorization): "user" by default. "root" exists only where the agent
// itself runs as root, in a sandbox of a template made from an image;
// elsewhere everything runs as "user", and saying otherwise would be a
// lie.
func (a *Agent) who(r *http.Request) (identity, error) {
	switch u := userFromRequest(r); u {
	case "", "user":
		return a.userIdentity(), nil
	case "root":
		if a.root {
			return rootUser, nil
		}
		return identity{}, errorf(agentproto.CodePermissionDenied, "user \"root\" is not available in this sandbox: its template runs everything as \"user\" (templates made from images have root)")
	default:
		return identity{}, errorf(agentproto.CodePermissionDenied, "user %q is not available: this sandbox has \"user\"%s", strings.TrimSpace(u), map[bool]string{true: " and \"root\""}[a.root])
	}
}

// userIdentity is the sandbox user, with the home the agent was given.
func (a *Agent) userIdentity() identity {
	id := sandboxUser
	id.home = a.home
	return id
}

// credential is what a process started for id runs as: nothing changes
// where the agent is id already.
func (a *Agent) credential(id identity) *syscall.Credential {
	if !a.root || id.uid == 0 {
		return nil
	}
	return &syscall.Credential{Uid: uint32(id.uid), Gid: uint32(id.gid), Groups: []uint32{uint32(id.gid)}}
}

// envFor is a process's environment for id.
func (a *Agent) envFor(id identity, extra map[string]string) []string {
	env := a.env(extra)
	if id.uid == 0 {
		for i, kv := range env {
			switch k, _, _ := strings.Cut(kv, "="); k {
			case "HOME":
				env[i] = "HOME=" + id.home
			case "USER", "LOGNAME":
				env[i] = k + "=" + id.name
			}
		}
	}
	return env
}

// resolveAs makes p absolute for id: "~" is id's home, relative paths
// start there.
func (a *Agent) resolveAs(id identity, p string) string {
	switch {
	case p == "~":
		return id.home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(id.home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(id.home, p)
	}
	return filepath.Clean(p)
}

// as runs f with the file-system identity of id: where the agent is root
// and id is not, on a thread whose fsuid and fsgid are id's, so that the
// kernel checks every access as it would id's own, and what f makes is
// id's. (The fsuid is per thread; the process's own ids never change.)
func (a *Agent) as(id identity, f func() error) error {
	if !a.root || id.uid == 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// setfsuid reports the previous id and no error: read it back.
		syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(id.gid), 0, 0)
		syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(id.uid), 0, 0)
		if cur, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0); int(cur) != id.uid {
			errc <- errorf(agentproto.CodeInternal, "cannot act as %s", id.name)
			return // the thread stays locked, and goes
		}
		err := f()
		syscall.RawSyscall(syscall.SYS_SETFSUID, 0, 0, 0)
		syscall.RawSyscall(syscall.SYS_SETFSGID, 0, 0, 0)
		if cur, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0); cur == 0 {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
