package sudo

import (
	"fmt"
	"os"
	"os/signal"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
)

// Main is sudo inside a sandbox: it takes sudo's usual options, builds
// the command and its environment as sudo does (env_reset and Debian's
// secure_path), has the agent run it, and returns its exit status.
func Main(args []string) int {
	o, err := parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n%s", err, usage)
		return 1
	}
	switch o.mode {
	case "help":
		fmt.Print(usage)
		return 0
	case "version":
		fmt.Println("Airlock sudo: commands run as the sandbox's root by its agent")
		return 0
	case "validate":
		return 0 // no password, so nothing to validate
	case "list":
		fmt.Printf("User %s may run the following commands on this sandbox:\n    (ALL : ALL) NOPASSWD: ALL\n", identity.User.Name)
		return 0
	}
	req, err := o.request()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	c, err := dial()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	defer c.Close()
	sigs := make(chan os.Signal, 16)
	// A signal sudo was started ignoring (nohup's SIGHUP) is not passed
	// on: the command, started by the agent, is in no terminal's session
	// and gets none but what sudo relays.
	for s := range relayedSignals {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	code, err := run(c, req, []int{0, 1, 2}, sigs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	return code
}

const usage = `usage: sudo [-EHnS] [-u user] [-D directory] [-i | -s] [VAR=value]... [--] command [arg ...]
       sudo -i | -s        (a shell)
       sudo -l | -v | -k | -K | -V | -h
`
