// Package identity is who a request acts as inside a sandbox, and the
// agent acting as them: per thread for file access, and as the
// credential of the processes it starts.
package identity

import (
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// ID is a user of the sandbox.
type ID struct {
	Name     string
	UID, GID int
	Home     string
}

var (
	// User is the sandbox's user, as E2B's templates have it.
	User = ID{"user", 1000, 1000, "/home/user"}
	// Root is the sandbox's root, which only an agent that is root
	// itself acts for.
	Root = ID{"root", 0, 0, "/root"}
)

// Users are whom an agent acts for: the sandbox's user, whose home is
// Home, and root where the agent itself is the sandbox's root (in a
// sandbox of a template made from an image).
type Users struct {
	Home string
	Root bool
	// Passwd is the file of the users a root agent acts for too, the
	// image's ("": /etc/passwd).
	Passwd string
}

// Who returns the identity a request asks for (envd names it in Basic
// authorization): "user" by default. "root" exists only where the agent
// itself runs as root; elsewhere everything runs as "user", and saying
// otherwise would be a lie.
func (u Users) Who(r *http.Request) (ID, error) {
	switch name := fromRequest(r); name {
	case "", User.Name:
		return u.User(), nil
	case Root.Name:
		if u.Root {
			return Root, nil
		}
		return ID{}, rpc.Errorf(agentproto.CodePermissionDenied, "user \"root\" is not available in this sandbox: its template runs everything as \"user\" (templates made from images have root)")
	default:
		if u.Root {
			return u.lookup(name)
		}
		return ID{}, rpc.Errorf(agentproto.CodePermissionDenied, "user %q is not available: this sandbox has \"user\"", strings.TrimSpace(name))
	}
}

// lookup is any other user of the image, as E2B's envd takes them: the
// agent is root there, so acting as them gives nothing the sandbox's
// root does not have. One the image lacks is refused as envd refuses it.
func (u Users) lookup(name string) (ID, error) {
	path := u.Passwd
	if path == "" {
		path = "/etc/passwd"
	}
	f, err := os.Open(path)
	if err != nil {
		return ID{}, rpc.Errorf(agentproto.CodeUnauthenticated, "invalid username: '%s': this sandbox has no %s", name, path)
	}
	defer f.Close()
	uid, gid, home, err := agentproto.LookupUser(f, name)
	if err != nil {
		return ID{}, rpc.Errorf(agentproto.CodeUnauthenticated, "invalid username: '%s': %v", name, err)
	}
	return ID{Name: name, UID: uid, GID: gid, Home: home}, nil
}

// fromRequest returns the user named in the request's Basic
// authorization (envd's way of choosing who runs a command), or "".
func fromRequest(r *http.Request) string {
	if name, _, ok := r.BasicAuth(); ok {
		return name
	}
	return r.URL.Query().Get("username")
}

// User is the sandbox's user, with the home the agent was given.
func (u Users) User() ID {
	id := User
	id.Home = u.Home
	return id
}

// Credential is what a process started for id runs as: nil, nothing
// changes, where the agent is id already.
func (u Users) Credential(id ID) *syscall.Credential {
	if !u.Root || id.UID == 0 {
		return nil
	}
	return &syscall.Credential{Uid: uint32(id.UID), Gid: uint32(id.GID), Groups: []uint32{uint32(id.GID)}}
}

// Resolve makes p absolute for id: "~" is id's home, relative paths
// start there (as in envd).
func (id ID) Resolve(p string) string {
	switch {
	case p == "~":
		return id.Home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(id.Home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(id.Home, p)
	}
	return filepath.Clean(p)
}

// As runs f with the file-system identity of id: where the agent is root
// and id is not, on a thread of its own acting as id (ActAs), so that the
// kernel checks every access as it would id's own, and what f makes is
// id's. Elsewhere f runs as the agent, which is id already.
func (u Users) As(id ID, f func() error) error {
	if !u.Root || id.UID == 0 {
		return f()
	}
	return OnThreadAs(id, f)
}

// OnThreadAs runs f on a thread acting as id (ActAs), and gives the
// thread back to the runtime only once it is root's again.
func OnThreadAs(id ID, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := ActAs(id)
		if err != nil {
			errc <- rpc.Errorf(agentproto.CodeInternal, "cannot act as %s: %v", id.Name, err)
			return // the thread stays locked, and goes
		}
		err = f()
		if restore() {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
