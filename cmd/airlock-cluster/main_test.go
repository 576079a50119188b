package main

import (
	"errors"
	"strings"
	"testing"
)

// A node does not register an address that routers could not parse: it
// says so before it connects to anything.
func TestNodeRefusesBadAdvertise(t *testing.T) {
	for _, bad := range []string{"http://[::1", "http://host:port", "http://user@host:80", "10.0.0.5:80"} {
		err := nodeCmd([]string{"--node-name", "n", "--advertise", bad, "--local", "http://127.0.0.1:1"})
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "--advertise: node address") {
			t.Errorf("--advertise %q: %v, want a usage error naming it", bad, err)
		}
	}
}
