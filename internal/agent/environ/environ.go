// Package environ is the environment of the processes the agent starts:
// its own, then the sandbox's envVars, then a request's.
package environ

import (
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
)

// Env is a sandbox's environment.
type Env struct {
	mu   sync.Mutex
	base []string          // the agent's own (PATH, LANG …)
	vars map[string]string // the sandbox's envVars, for every process
}

// New returns the environment whose base is base (the agent's own, as
// os.Environ gives it).
func New(base []string) *Env {
	return &Env{base: slices.Clone(base), vars: map[string]string{}}
}

// Set adds the sandbox's envVars, which every process started from now on
// gets.
func (e *Env) Set(vars map[string]string) {
	e.mu.Lock()
	maps.Copy(e.vars, vars)
	e.mu.Unlock()
}

// For is a process's environment, sorted: the base, then the sandbox's
// envVars, then extra, later ones winning.
func (e *Env) For(extra map[string]string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := map[string]string{}
	for _, kv := range e.base {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	maps.Copy(m, e.vars)
	maps.Copy(m, extra)
	env := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		env = append(env, k+"="+m[k])
	}
	return env
}

// ForID is For of a process that runs as id: root's, or another user's
// of the image, gets their HOME, USER and LOGNAME (the agent's own are
// the user's).
func (e *Env) ForID(id identity.ID, extra map[string]string) []string {
	env := e.For(extra)
	// The sandbox's environment is the user's: root, and any other user
	// of the image, get their own home and name.
	if id.Name != identity.User.Name {
		for i, kv := range env {
			switch k, _, _ := strings.Cut(kv, "="); k {
			case "HOME":
				env[i] = "HOME=" + id.Home
			case "USER", "LOGNAME":
				env[i] = k + "=" + id.Name
			}
		}
	}
	return env
}
