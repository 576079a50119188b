package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/airlock-sandbox/airlock/internal/build"
	"github.com/airlock-sandbox/airlock/internal/config"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// pulls is the rule of the addresses clients' builds may pull from.
func pulls(b config.Builds) (build.PullRule, error) {
	r := build.PullRule{Private: b.PrivateRegistries}
	for _, s := range b.RegistryAddresses {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				return r, fmt.Errorf("builds.registryAddresses: %q is not an IP address or a CIDR prefix (127.0.0.1, 10.1.0.0/16)", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		r.Allow = append(r.Allow, p.Masked())
	}
	return r, nil
}

// BuildSettings is the builds' configuration with its defaults filled
// in, and the policy of build sandboxes (without their image).
func BuildSettings(cfg *config.Config) (config.Builds, policy.Policy, error) {
	b := cfg.Builds
	def := func(v *config.Size, d int64) {
		if *v == 0 {
			*v = config.Size(d)
		}
	}
	def(&b.Memory, 2<<30)
	def(&b.Disk, 4<<30)
	def(&b.Upload, 1<<30)
	if b.Timeout == 0 {
		b.Timeout = config.Duration(time.Hour)
	}
	if b.ReadyTimeout == 0 {
		b.ReadyTimeout = config.Duration(time.Minute)
	}
	if b.Parallel == 0 {
		b.Parallel = 2
	}
	p := policy.Default()
	p.MemoryBytes, p.DiskBytes, p.Pids = int64(b.Memory), int64(b.Disk), 4096
	switch b.Network {
	case "", "internet":
		b.Network = "internet"
		p.Network = policy.Network{Mode: policy.NetInternet}
	case "none":
	default:
		return b, p, fmt.Errorf("builds.network %q: internet or none", b.Network)
	}
	if b.Parallel < 0 || b.Timeout < 0 || b.ReadyTimeout < 0 {
		return b, p, errors.New("builds: parallel and timeouts must not be negative")
	}
	if _, err := pulls(b); err != nil {
		return b, p, err
	}
	return b, p, p.Validate()
}

// buildHost starts build sandboxes as the manager's private ones.
type buildHost struct {
	m *sandbox.Manager
	b sandbox.Backend
}

func (h buildHost) StartBox(ctx context.Context, p policy.Policy) (build.Box, error) {
	return h.m.StartPrivate(ctx, h.b, p)
}

// BuildHost is the host of airlock template build's sandboxes: the
// operator's own build, on the namespaces backend of stateDir, with the
// host's network if withNetwork. stop ends its sandboxes.
func BuildHost(ctx context.Context, stateDir string, withNetwork bool, log *slog.Logger) (host build.Host, stop func(), err error) {
	cfg := config.Default()
	cfg.StateDir = stateDir
	backends := newBackends(stateDir, "", nil, log)
	if err := openStateDir(ctx, stateDir, backends, log); err != nil {
		return nil, nil, err
	}
	ns, _ := backends.get("namespaces")
	mcfg := sandbox.Config{DefaultTTL: time.Hour, MaxTTL: time.Hour}
	var network *hostNetwork
	if withNetwork {
		if network, err = newNetwork(&cfg, log); err != nil {
			return nil, nil, err
		}
		if network == nil || network.unavailable != nil {
			return nil, nil, configErrorf("this host cannot give the build a network: build with --net none")
		}
		network.cleanup(log)
		mcfg.Network = network
	}
	m := sandbox.NewManager(mcfg, ns, log)
	stop = func() {
		m.Shutdown()
		network.close(log)
	}
	return buildHost{m, ns}, stop, nil
}
