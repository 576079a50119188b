// Package filestate moves a sandbox's files in and out as tar streams,
// for the daemon alone: the files-only pause's save and restore, and a
// template build's COPY.
//
// A pause that keeps only the files (E2B's keepMemory: false) saves what
// the sandbox's user can change of its file system, and nothing that
// runs: the daemon takes the tar stream of those directories from the
// agent (GET agentproto.SavedFilesPath), ends the sandbox, and at connect
// starts a new one of its template and gives the stream back to its
// agent (POST agentproto.SavedFilesPath) before anything else runs there.
//
// The daemon only keeps the stream: it is the sandbox's own, made and
// read inside it, by the sandbox's user. In a template of the daemon's
// (base, the code interpreter) these are the only places that user can
// write; the daemon refuses the pause for other sandboxes.
package filestate

import (
	"log/slog"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// dirs are the directories a files-only pause keeps, relative to "/".
var dirs = []string{"home/user", "tmp"}

// Service moves one sandbox's files.
type Service struct {
	log *slog.Logger
	// root says whether the agent is the sandbox's root: only then may
	// it give files other owners than its own.
	root bool
	// base is where dirs are: "/", another directory in tests.
	base string
}

// New returns the service of an agent that is the sandbox's root or not.
func New(log *slog.Logger, root bool) *Service { return NewAt(log, root, "/") }

// NewAt is New for an agent whose sandbox's / is base: the fake backend
// keeps a box's home and /tmp below a directory of its own.
func NewAt(log *slog.Logger, root bool, base string) *Service {
	return &Service{log: log, root: root, base: base}
}

// Register adds the daemon's private SavedFilesPath and UntarPath to mux.
func (s *Service) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET "+agentproto.SavedFilesPath, s.Save)
	mux.HandleFunc("POST "+agentproto.SavedFilesPath, s.Restore)
	mux.HandleFunc("POST "+agentproto.UntarPath, s.Untar)
}
