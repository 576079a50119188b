package sandbox

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// setup tells the agent the sandbox's environment.
func (m *Manager) setup(ctx context.Context, sb *Sandbox, env map[string]string) error {
	return setupAgent(ctx, sb.transport, env)
}

// setupAgent gives the agent that tr reaches the sandbox's environment.
func setupAgent(ctx context.Context, tr http.RoundTripper, env map[string]string) error {
	if len(env) == 0 {
		return nil
	}
	return (&agentproto.Client{Transport: tr}).Setup(ctx, agentproto.Setup{EnvVars: env})
}

// agentTransport speaks HTTP to the agent inside inst. Streams must not be
// cut by timeouts here: the SDK sets its own.
func agentTransport(inst func() Instance) *http.Transport {
	return &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, inst) },
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// portTransport speaks HTTP to the servers in inst, each connection one
// that the agent made to the port on the sandbox's loopback. URLs name
// the port as their host's ("http://127.0.0.1:3000/…"); an https URL
// speaks TLS to the server without checking its certificate (E2B's
// httpsPorts: the sandbox's own, often self-signed).
func portTransport(inst func() Instance) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(p)
			if err != nil {
				return nil, err
			}
			c, err := dial(ctx, inst)
			if err != nil {
				return nil, err
			}
			fc, err := agentproto.DialForward(ctx, c, port)
			if err != nil {
				c.Close()
				return nil, err
			}
			return fc, nil
		},
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

// dial connects to the agent of the box inst returns now: none while the
// sandbox is saved to disk.
func dial(ctx context.Context, inst func() Instance) (net.Conn, error) {
	i := inst()
	if i == nil {
		return nil, errors.New("the sandbox is paused")
	}
	return i.Dial(ctx)
}

// the returns an Instance, for the transports of a box that never changes.
func the(inst Instance) func() Instance { return func() Instance { return inst } }
