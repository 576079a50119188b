// Command airlock-sandbox is what runs inside a sandbox: its init (on the
// namespaces backend), its agent and sudo. airlock embeds it (package
// sandboxbin) and starts it in every sandbox, so it carries only these.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/agent"
	"github.com/airlock-sandbox/airlock/internal/agent/sudo"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend/namespaces/nsinit"
)

func main() {
	switch {
	case nsinit.IsInit():
		// The first process of a new sandbox: nothing else may run first.
		nsinit.Main()
	case filepath.Base(os.Args[0]) == "sudo":
		// Inside a sandbox with a root, the binary is sudo too.
		os.Exit(sudo.Main(os.Args[1:]))
	case len(os.Args) == 2 && os.Args[1] == agentproto.AgentArg:
		// Started by the sandbox's init: serve the envd protocol.
		if err := agent.Main(); err != nil {
			fmt.Fprintln(os.Stderr, "airlock agent:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintln(os.Stderr, "airlock-sandbox runs inside Airlock's sandboxes only; use airlock")
	os.Exit(2)
}
