package mcp

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type pathIn struct {
	Path string `json:"path" jsonschema:"a path in the sandbox; relative paths start at /home/user"`
}

// readFile returns text as text and images as images the model can see;
// other binary files are described, not dumped.
func (s *Server) readFile(ctx context.Context, req *sdk.CallToolRequest, in pathIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	data, truncated, err := readFile(ctx, sb, in.Path, maxImage)
	if err != nil {
		return s.sandboxFailure("read_file", sb, err), nil, nil
	}
	result := func(c sdk.Content) (*sdk.CallToolResult, any, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{c}}, nil, nil
	}
	switch kind := http.DetectContentType(data); kind {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		if truncated {
			return toolError("read_file: the image is larger than %d MiB", maxImage>>20), nil, nil
		}
		return result(&sdk.ImageContent{Data: data, MIMEType: kind})
	}
	if len(data) > maxFile {
		data, truncated = data[:maxFile], true
	}
	text, ok := utf8Prefix(data, truncated)
	if !ok {
		return result(&sdk.TextContent{Text: fmt.Sprintf("%s is a binary file (%s): not shown. Inspect it with run_code or run_command.",
			in.Path, http.DetectContentType(data))})
	}
	if truncated {
		text += fmt.Sprintf("\n[file truncated at %d bytes]", maxFile)
	}
	return result(&sdk.TextContent{Text: text})
}

// utf8Prefix reports whether data is UTF-8 text. A cut-off file may end
// in the middle of a character: that tail is dropped, not held against it.
func utf8Prefix(data []byte, cut bool) (string, bool) {
	for trim := 0; trim <= 3 && trim <= len(data); trim++ {
		if utf8.Valid(data[:len(data)-trim]) {
			return string(data[:len(data)-trim]), true
		}
		if !cut {
			break
		}
	}
	return "", false
}

type writeIn struct {
	Path    string `json:"path" jsonschema:"where to write, in the sandbox"`
	Content string `json:"content" jsonschema:"the text to write"`
}

func (s *Server) writeFile(ctx context.Context, req *sdk.CallToolRequest, in writeIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	if err := writeFile(ctx, sb, in.Path, []byte(in.Content)); err != nil {
		return s.sandboxFailure("write_file", sb, err), nil, nil
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: fmt.Sprintf("wrote %d bytes to %s", len(in.Content), in.Path)}}}, nil, nil
}

type listIn struct {
	Path  string `json:"path" jsonschema:"the directory to list"`
	Depth int    `json:"depth,omitempty" jsonschema:"how deep to list; default 1"`
}

func (s *Server) listFiles(ctx context.Context, req *sdk.CallToolRequest, in listIn) (*sdk.CallToolResult, any, error) {
	sb, err := s.sandboxFor(ctx, req)
	if err != nil {
		return s.failure("no sandbox", err), nil, nil
	}
	depth := max(in.Depth, 1)
	entries, err := listFiles(ctx, sb, in.Path, depth)
	if err != nil {
		return s.sandboxFailure("list_files", sb, err), nil, nil
	}
	var b strings.Builder
	for _, e := range entries {
		kind := "file"
		if e.Type == agentproto.FileTypeDirectory {
			kind = "dir"
		}
		fmt.Fprintf(&b, "%s\t%d\t%s\n", kind, e.Size, e.Path)
	}
	if b.Len() == 0 {
		b.WriteString("(empty)")
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: capText(b.String())}}}, nil, nil
}
