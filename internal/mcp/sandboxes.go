package mcp

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

type createIn struct {
	Template       string            `json:"template,omitempty" jsonschema:"base or code-interpreter-v1 (default)"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"the sandbox's time to live, within the server's bounds"`
	MemoryMB       int64             `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB; at most the template's (list_sandboxes shows it)"`
	CPUs           float64           `json:"cpus,omitempty" jsonschema:"CPU limit in cores, e.g. 0.5; at most the template's"`
	Pids           int64             `json:"pids,omitempty" jsonschema:"limit on processes and threads; at most the template's"`
	DiskMB         int64             `json:"disk_mb,omitempty" jsonschema:"size limit of /tmp and /home/user in MiB; at most the template's"`
	Volumes        map[string]string `json:"volumes,omitempty" jsonschema:"volumes to mount read-write, each an absolute path inside to a volume's name, e.g. {\"/mnt/data\": \"data\"} (volumes are made with the E2B SDK's Volume.create)"`
}

func (s *Server) createSandbox(ctx context.Context, req *sdk.CallToolRequest, in createIn) (*sdk.CallToolResult, any, error) {
	tmpl := in.Template
	if tmpl == "" {
		tmpl = codeTemplate
	}
	ttl := s.ttl
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxSeconds {
		return toolError("create_sandbox: timeout_seconds must be between 1 and %d", maxSeconds), nil, nil
	} else if in.TimeoutSeconds > 0 {
		ttl = time.Duration(in.TimeoutSeconds) * time.Second
	}
	if in.MemoryMB < 0 || in.CPUs < 0 || in.Pids < 0 || in.DiskMB < 0 {
		return toolError("create_sandbox: memory_mb, cpus, pids and disk_mb must not be negative"), nil, nil
	}
	ss := s.session(req)
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return toolError("create_sandbox: the session has ended"), nil, nil
	}
	limits := sandbox.Limits{MemoryBytes: mib(in.MemoryMB), CPUs: in.CPUs, Pids: in.Pids, DiskBytes: mib(in.DiskMB)}
	var volumes []sandbox.VolumeMount
	for _, p := range slices.Sorted(maps.Keys(in.Volumes)) {
		volumes = append(volumes, sandbox.VolumeMount{Name: in.Volumes[p], Path: p})
	}
	sb, err := s.create(ctx, tmpl, ttl, limits, volumes)
	old := ss.sandboxID
	if err == nil {
		ss.sandboxID, ss.template, ss.limits, ss.volumes, ss.ttl = sb.ID, tmpl, limits, volumes, ttl
	}
	ss.mu.Unlock()
	if err != nil {
		return s.failure("create_sandbox", err), nil, nil
	}
	if old != "" {
		s.m.Kill(old)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("sandbox %s (%s) ready; it ends after %s without a tool call", sb.ID, tmpl, ttl)}}}, nil, nil
}

// mib converts MiB (not negative) to bytes, saturating: a huge request
// stays huge (and is refused as such) instead of wrapping around.
func mib(v int64) int64 {
	if v > math.MaxInt64>>20 {
		return math.MaxInt64
	}
	return v << 20
}

// ownSandbox is the session's sandbox id, "" if it has none.
func (s *Server) ownSandbox(req *sdk.CallToolRequest) string {
	ss := s.session(req)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.sandboxID
}

// killSandbox ends the session's own sandbox. A session can touch no
// other: the model behind it may be following injected instructions.
func (s *Server) killSandbox(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
	id := s.ownSandbox(req)
	if id == "" || s.m.Kill(id) != nil {
		return toolError("this session has no sandbox"), nil, nil
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "killed " + id + "; the next tool call starts a fresh sandbox"}}}, nil, nil
}

// listSandboxes shows the session's sandbox, the only one it can use.
func (s *Server) listSandboxes(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, any, error) {
	sb, err := s.m.Get(s.ownSandbox(req))
	if err != nil {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "(none: the next tool call starts one)"}}}, nil, nil
	}
	text := fmt.Sprintf("%s\t%s\tuntil %s\tmemory %d MiB, %g CPUs, disk %d MiB",
		sb.ID, sb.TemplateID, sb.EndAt().UTC().Format(time.RFC3339), sb.MemoryMB, sb.CPUs, sb.DiskMB)
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}}, nil, nil
}
