package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/runsock"
)

// claimWait is how long airlock run waits for a daemon to claim a
// sandbox before it runs the command directly; nothing has run by then.
const claimWait = 2 * time.Second

// viaDaemon runs spec in a sandbox of the pool of a local airlock serve
// (package runsock), as --daemon says. It returns nil and no error where
// the command is to run directly instead: no daemon answers, or one
// declined before anything ran.
func (f *runFlags) viaDaemon(ctx context.Context, spec *backend.Spec) (*backend.Result, error) {
	if f.daemon == "never" {
		return nil, nil
	}
	decline := func(why string) (*backend.Result, error) {
		if f.daemon == "always" {
			return nil, usageError{"--daemon always: " + why}
		}
		return nil, nil
	}
	if why := f.directOnly(spec); why != "" {
		return decline(why + " runs only directly")
	}
	c, err := runsock.Dial(f.stateDir)
	if err != nil {
		return decline(err.Error())
	}
	// The command, its environment, stdin and code go only to a daemon
	// of root's: a state directory others can write could hold anyone's
	// socket.
	if !runsock.PeerIsRoot(c) {
		c.Close()
		return decline("the socket in the state directory is not root's daemon's")
	}
	// Once the result is in, the connection is left to the process's
	// exit to close: the daemon tears the sandbox down when it closes,
	// and that work should not compete with airlock's own exit.
	done := false
	defer func() {
		if !done {
			c.Close()
		}
	}()
	p := &spec.Policy
	req := runsock.Request{
		V: runsock.Version, Backend: f.backend,
		Argv: spec.Argv, Env: layout.Env(p), Cwd: p.Workdir, Umask: umask(), Stdin: spec.Stdin != nil,
		MemoryBytes: p.MemoryBytes, Pids: p.Pids, CPUs: p.CPUs, DiskBytes: p.DiskBytes,
		Timeout: p.Timeout, OutputLimit: p.OutputLimit, Network: p.Network, Files: spec.Files,
	}
	// Until the daemon has claimed a sandbox and been told to go, the
	// command can still run directly: nothing ran.
	c.SetDeadline(time.Now().Add(claimWait))
	if err := agentproto.WriteJSONFrame(c, agentproto.FrameRequest, req); err != nil {
		return decline("the daemon did not take the request: " + err.Error())
	}
	typ, why, err := agentproto.ReadFrame(c, agentproto.MaxFrame)
	switch {
	case err != nil:
		return decline("the daemon did not answer: " + err.Error())
	case typ == runsock.FrameDirect:
		return decline("the daemon declined: " + string(why))
	case typ != runsock.FrameClaimed:
		return decline(fmt.Sprintf("the daemon answered frame %q", typ))
	}
	if err := agentproto.WriteFrame(c, runsock.FrameGo, nil); err != nil {
		return decline("the daemon went away: " + err.Error())
	}
	c.SetDeadline(time.Time{})
	// From here the command runs: a failure is airlock's, never a
	// second run. An interrupt closes the connection, and the daemon
	// kills the sandbox.
	stopClose := context.AfterFunc(ctx, func() { c.Close() })
	defer stopClose()
	if spec.Stdin != nil {
		go agentproto.CopyStdin(c, spec.Stdin)
	}
	for {
		typ, data, err := agentproto.ReadFrame(c, agentproto.MaxFrame)
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintln(os.Stderr, "airlock: interrupted; sandbox killed")
				return nil, exitError{130}
			}
			return nil, fmt.Errorf("the daemon ended the run: %w", err)
		}
		switch typ {
		case agentproto.FrameStdout:
			spec.Stdout.Write(data)
		case agentproto.FrameStderr:
			spec.Stderr.Write(data)
		case runsock.FrameResult:
			var res runsock.Result
			if err := agentproto.DecodeStrict(data, &res); err != nil {
				return nil, fmt.Errorf("the daemon's result: %w", err)
			}
			done = true
			if res.SetupError != "" {
				return nil, &backend.SetupError{Msg: res.SetupError}
			}
			return &res.Result, nil
		}
	}
}

// directOnly says what of f, if anything, a pooled sandbox cannot give:
// those run only directly.
func (f *runFlags) directOnly(spec *backend.Spec) string {
	p := &spec.Policy
	switch {
	case len(p.Mounts) > 0:
		return "--mount"
	case len(f.dns) > 0:
		// The daemon's sandboxes resolve through its own resolver.
		return "--dns"
	case f.template != "" || p.Root:
		return "--template"
	case f.runscSet:
		return "--runsc"
	case !filepath.IsAbs(p.Workdir):
		return "a relative --workdir"
	}
	return ""
}

// umask is this process's, which the command inherits on the direct path.
func umask() uint32 {
	old := unix.Umask(0o022)
	unix.Umask(old)
	return uint32(old)
}
