package daemon

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/config"
)

func TestBuildsRegistryAddresses(t *testing.T) {
	b := config.Builds{PrivateRegistries: true, RegistryAddresses: []string{"127.0.0.1", "10.1.2.3/16", "::1", "fd00::1/64"}}
	r, err := pulls(b)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.Allow {
		got = append(got, p.String())
	}
	if want := "127.0.0.1/32 10.1.0.0/16 ::1/128 fd00::/64"; strings.Join(got, " ") != want || !r.Private {
		t.Errorf("pulls: %v (private %v), want %s", got, r.Private, want)
	}
	for _, bad := range []string{"registry.local", "10.0.0.0/33", "fe80::1%eth0", ""} {
		_, _, err := BuildSettings(&config.Config{Builds: config.Builds{RegistryAddresses: []string{bad}}})
		if err == nil || !strings.Contains(err.Error(), "builds.registryAddresses") || strings.Contains(err.Error(), "\n") {
			t.Errorf("registryAddresses %q: %v, want one line naming builds.registryAddresses", bad, err)
		}
	}
}
