package namespaces

import (
	"io"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// The default template, shared with the other backends so that a sandbox
// looks the same whatever isolates it.

// HostEtc lists the /etc entries shared read-only with a sandbox.
func HostEtc() []string { return hostEtc }

// HostRootLinks lists the merged-/usr top-level entries a sandbox mirrors.
func HostRootLinks() []string { return hostRootLinks }

// GeneratedEtc returns the /etc files written for each sandbox.
func GeneratedEtc(hostname string) map[string][]byte { return generatedEtc(hostname) }

// DefaultEnv returns a command's environment under p.
func DefaultEnv(p *policy.Policy) []string { return defaultEnv(p) }

// Hostname is every sandbox's host name.
const Hostname = hostname

// CodeDir is where code files appear inside a sandbox.
const CodeDir = codeDir

// CappedWriter passes at most limit bytes to w and drops the rest, still
// consuming it; Truncated reports whether anything was dropped.
type CappedWriter interface {
	io.Writer
	Truncated() bool
}

// NewCappedWriter returns a CappedWriter over w (nil: discard).
func NewCappedWriter(w io.Writer, limit int64) CappedWriter { return newCapped(w, limit) }

func (c *capped) Truncated() bool { return c.truncated }
