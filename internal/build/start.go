package build

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/layout"
)

// Start runs a template's start command in the background of a sandbox
// and waits until its ready command exits 0 (checked every 200 ms), or
// for timeout. Without a ready command the sandbox is ready once the
// start command runs.
func Start(ctx context.Context, c *agentproto.Client, cfg *image.Config, timeout time.Duration, log Logger) error {
	user := cfg.User
	if user == "" {
		user = layout.User
	}
	dir := cfg.WorkingDir
	if dir == "" {
		dir = layout.Home
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The start command lives on after this call: it is the sandbox's,
	// with its output on the agent's side only.
	envs := map[string]string{}
	for _, kv := range cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		envs[k] = v
	}
	stdin := false
	req := agentproto.StartRequest{Process: &agentproto.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cfg.StartCmd}, Envs: envs, Cwd: &dir}, Stdin: &stdin}
	for ev, err := range agentproto.Stream[agentproto.StartResponse](ctx, as(c, user), agentproto.StartProcedure, req, 0) {
		if err != nil {
			return fmt.Errorf("start command: %w", err)
		}
		if ev.Event != nil && ev.Event.Start != nil {
			break // it runs: leave it to itself
		}
	}
	if cfg.ReadyCmd == "" {
		return nil
	}
	quiet := func(string, string) {}
	for {
		code, err := Run(ctx, c, cfg.ReadyCmd, user, dir, cfg.Env, quiet)
		if err == nil && code == 0 {
			log("info", "ready: "+cfg.ReadyCmd)
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("the ready command did not succeed within %s: %s", timeout, cfg.ReadyCmd)
			}
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
