package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

type runCodeIn struct {
	Code      string `json:"code" jsonschema:"the code to run"`
	Language  string `json:"language,omitempty" jsonschema:"the kernel's language: python (the default), javascript (js), typescript (ts), r or bash"`
	ContextID string `json:"context_id,omitempty" jsonschema:"an interpreter context id, to keep separate state"`
	// TimeoutSeconds bounds the cell; the kernel is interrupted at the
	// end and keeps its state, as with E2B's runCode timeout.
	TimeoutSeconds int `json:"timeout_seconds,omitempty" jsonschema:"interrupt the cell after this many seconds (its variables are kept); default 300"`
}

func (s *Server) runCode(ctx context.Context, req *sdk.CallToolRequest, in runCodeIn) (*sdk.CallToolResult, any, error) {
	timeout := 300 * time.Second
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxSeconds {
		return toolError("timeout_seconds must be between 1 and %d", maxSeconds), nil, nil
	} else if in.TimeoutSeconds > 0 {
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := executeCode(cctx, sb, in.Code, in.Language, in.ContextID, progress(cctx, req))
	// At the timeout the agent interrupts the kernel when the request
	// goes away; what the cell printed until then is still worth showing.
	timedOut := err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded)
	if err != nil && !timedOut {
		return s.sandboxFailure("run_code", sb, err), nil, nil
	}
	if out == nil {
		out = &codeOutput{}
	}
	res := &sdk.CallToolResult{}
	text := func(t string) { res.Content = append(res.Content, &sdk.TextContent{Text: capText(t)}) }
	if out.Stdout.Len() > 0 {
		text("stdout:\n" + out.Stdout.String())
	}
	if out.Stderr.Len() > 0 {
		text("stderr:\n" + out.Stderr.String())
	}
	for _, r := range out.Results {
		shown := false
		for _, img := range []struct{ mime, b64 string }{{"image/png", r.PNG}, {"image/jpeg", r.JPEG}} {
			if img.b64 == "" {
				continue
			}
			if data, err := decodeBase64(img.b64); err == nil {
				res.Content = append(res.Content, &sdk.ImageContent{Data: data, MIMEType: img.mime})
				shown = true
			}
		}
		for _, v := range []string{r.Markdown, r.HTML} {
			if v != "" && !shown {
				text(v)
				shown = true
			}
		}
		if !shown {
			text(r.Text)
		}
	}
	if out.Error != nil {
		res.IsError = true
		text(fmt.Sprintf("%s: %s\n%s", out.Error.Name, out.Error.Value, stripANSI(out.Error.Traceback)))
	}
	if timedOut {
		res.IsError = true
		text(fmt.Sprintf("the cell did not finish within %s and was interrupted; variables defined before are kept", timeout))
	}
	if len(res.Content) == 0 {
		text("(no output)")
	}
	return res, nil, nil
}

// progress returns a function that passes a cell's output on to the
// client as progress notifications while the cell runs, if the client
// asked for progress: a long cell shows signs of life before its result.
// At most one notification goes out per progressEvery; output printed
// in between is sent together, its tail if it is long.
func progress(ctx context.Context, req *sdk.CallToolRequest) func(string) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil
	}
	var (
		pending strings.Builder
		last    time.Time
		n       float64
	)
	return func(text string) {
		pending.WriteString(text)
		if time.Since(last) < progressEvery {
			return
		}
		msg := pending.String()
		if i := len(msg) - maxProgress; i > 0 {
			for i < len(msg) && !utf8.RuneStart(msg[i]) {
				i++
			}
			msg = "…" + msg[i:]
		}
		pending.Reset()
		last, n = time.Now(), n+1
		// A client that cannot take it does not stop the cell.
		_ = req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: token, Progress: n, Message: msg})
	}
}

func stripANSI(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
