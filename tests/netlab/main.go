// Command netlab runs a command inside a fake internet (package nettest):
// in the lab's host network namespace, whose only uplink leads to the
// lab's own DNS, HTTP, TLS and TCP servers. The network tests of the SDK
// suites run under it, so that no packet of theirs can leave the machine.
//
//	netlab COMMAND [ARG…]
//
// The command's environment tells it the lab: AIRLOCK_LAB_DNS (the DNS
// server, IP:PORT) and AIRLOCK_LAB_CA (the PEM file of the CA that signed
// the TLS servers' certificates) and AIRLOCK_LAB_DNS_LOG (a file of every
// name the DNS server was asked, one a line with its type: "A x.test") and
// AIRLOCK_LAB_HTTP_LOG (a file of every request the web servers answered,
// one JSON object a line: host, path, tls, authorization, from). Every lab
// address has a SOCKS5 proxy on port 1080 (user lab, password lab-pass).
// netlab exits with the command's status.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/nettest"
)

func main() {
	code, err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "netlab:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func run(args []string) (int, error) {
	if len(args) == 0 {
		return 0, errors.New("usage: netlab COMMAND [ARG…]")
	}
	dir, err := os.MkdirTemp("", "netlab-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	lab, err := nettest.New(dir)
	if err != nil {
		return 0, fmt.Errorf("build the lab: %w", err)
	}
	defer lab.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"AIRLOCK_LAB_DNS="+nettest.DNSAddr.String()+":53",
		"AIRLOCK_LAB_CA="+lab.CAFile,
		"AIRLOCK_LAB_DNS_LOG="+lab.DNSLog,
		"AIRLOCK_LAB_HTTP_LOG="+lab.HTTPLog)
	// Signals for netlab are the command's: it must end first, so that the
	// lab is taken down after it.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if err := nettest.Do(lab.Host, cmd.Start); err != nil {
		return 0, err
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return 0, err
}
