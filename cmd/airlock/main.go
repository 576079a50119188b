// Command airlock runs untrusted code in ephemeral sandboxes.
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/backend/namespaces"
	"github.com/airlock-sandbox/airlock/internal/daemon"
)

const usage = `usage: airlock <command> [flags]

commands:
  run     run a command or a code snippet in a fresh sandbox
  serve   serve the E2B-compatible API (sandboxes, gateway, warm pools) and MCP at /mcp
  router  the entry point of a cluster of airlock serve nodes on Kubernetes
  mcp     serve MCP over stdio, for agents that start their tools
  template  pull, import, list and remove templates (OCI images)
  bench   compare airlock run against bare python3
  version print the version
`

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// exitError carries an exit code to main without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// usageError is bad input: reported on one line, exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func main() {
	if err := closeInheritedOnExec(); err != nil {
		// Fail closed: a descriptor left open would reach every sandbox.
		fmt.Fprintln(os.Stderr, "airlock: cannot mark inherited descriptors close-on-exec:", err)
		os.Exit(1)
	}
	if len(os.Args) > 1 && os.Args[1] == namespaces.SpawnerArg {
		os.Exit(namespaces.ServeSpawner(os.Args[2:])) // a daemon's, not a command
	}
	os.Exit(exitCode(run(os.Args[1:])))
}

// closeInheritedOnExec marks every descriptor airlock inherited beyond
// stdio (a shell's, a supervisor's) close-on-exec. os/exec hands a child
// every descriptor without that flag, and a sandbox's init is such a
// child: it would hold the descriptor for its whole life, where a
// process of the sandbox running as init's user could open it through
// /proc/1/fd. Go opens its own descriptors close-on-exec.
func closeInheritedOnExec() error {
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return nil
	}
	return markInheritedOnExec() // before Linux 5.11
}

// markInheritedOnExec is closeInheritedOnExec one descriptor at a time.
// The directory's own descriptor is listed too, and is closed by the time
// it is reached.
func markInheritedOnExec() error {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
			return fmt.Errorf("descriptor %d: %w", fd, err)
		}
	}
	return nil
}

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitError{2}
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:])
	case "bench":
		return benchCmd(args[1:])
	case "serve":
		return serveCmd(args[1:])
	case "router":
		return routerCmd(args[1:])
	case "mcp":
		return mcpCmd(args[1:])
	case "template":
		return templateCmd(args[1:])
	case "version", "--version":
		fmt.Println("airlock", version)
		return nil
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q (try airlock help)", args[0])}
}

func exitCode(err error) int {
	var ee exitError
	var ue usageError
	var ce *daemon.ConfigError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, "airlock:", ue.msg)
		return 2
	case errors.As(err, &ce):
		fmt.Fprintln(os.Stderr, "airlock:", ce)
		return 2
	}
	fmt.Fprintln(os.Stderr, "airlock:", err)
	return 125 // the convention of timeout(1) and docker: airlock itself failed
}
