package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type runCommandIn struct {
	Command        string `json:"command" jsonschema:"the shell command to run (bash)"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default 60"`
	Background     bool   `json:"background,omitempty" jsonschema:"start it and return its pid without waiting"`
}

func (s *Server) runCommand(ctx context.Context, req *sdk.CallToolRequest, in runCommandIn) (*sdk.CallToolResult, any, error) {
	if in.Command == "" {
		return toolError("command is empty"), nil, nil
	}
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	timeout := 60 * time.Second
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxSeconds {
		return toolError("timeout_seconds must be between 1 and %d", maxSeconds), nil, nil
	} else if in.TimeoutSeconds > 0 {
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := runCommand(cctx, sb, in.Command, in.Background)
	if in.Background && err == nil {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("started in the background, pid %d", out.Pid)}}}, nil, nil
	}
	if err != nil && ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(cctx.Err(), context.DeadlineExceeded)) {
		return toolError("the command did not finish within %s", timeout), nil, nil
	}
	if err != nil {
		return s.sandboxFailure("run_command", sb, err), nil, nil
	}
	res := &sdk.CallToolResult{IsError: out.ExitCode != 0}
	ended := fmt.Sprintf("exit code %d", out.ExitCode)
	if strings.HasPrefix(out.Status, "signal: ") {
		// Killed: say by what, and the likeliest cause of a SIGKILL.
		ended += " (" + out.Status
		if out.Status == "signal: killed" {
			ended += "; the sandbox's memory limit is the usual cause"
		}
		ended += ")"
	}
	res.Content = append(res.Content, &sdk.TextContent{Text: capText(fmt.Sprintf("%s\nstdout:\n%s\nstderr:\n%s", ended, out.Stdout.String(), out.Stderr.String()))})
	return res, nil, nil
}
