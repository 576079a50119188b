package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
)

func TestNetworkRates(t *testing.T) {
	cfg := config.Default()
	cfg.Network.DNSRate, cfg.Network.ConnectionRate = "20/m", "5/h"
	n, err := networkHost(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := (netpolicy.Rate{N: 20, Per: time.Minute, Burst: 40}); n.Limits.DNSRate != want {
		t.Errorf("dnsRate 20/m read as %+v, want %+v", n.Limits.DNSRate, want)
	}
	if want := (netpolicy.Rate{N: 5, Per: time.Hour, Burst: 10}); n.Limits.ConnectionRate != want {
		t.Errorf("connectionRate 5/h read as %+v, want %+v", n.Limits.ConnectionRate, want)
	}
	for _, bad := range []string{"100", "0/s", "-1/s", "10/d", "x/s", "10/"} {
		cfg.Network.DNSRate = bad
		if _, err := networkHost(&cfg); err == nil || !strings.Contains(err.Error(), "network.dnsRate") {
			t.Errorf("dnsRate %q: %v, want an error naming network.dnsRate", bad, err)
		}
	}
}
