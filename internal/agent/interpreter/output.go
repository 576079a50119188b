package interpreter

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
)

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// asciiJSON encodes v with every non-ASCII character escaped: the SDKs
// decode each network chunk on its own, so a multi-byte character split
// between two chunks would be corrupted.
func asciiJSON(v any) []byte {
	data, _ := json.Marshal(v)
	out := make([]byte, 0, len(data))
	for _, r := range string(data) {
		switch {
		case r < 0x80:
			out = append(out, byte(r))
		case r > 0xffff:
			r -= 0x10000
			out = fmt.Appendf(out, "\\u%04x\\u%04x", 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			out = fmt.Appendf(out, "\\u%04x", r)
		}
	}
	return out
}

// joinTraceback makes one text of a kernel's traceback lines: IPython's
// and Deno's end without a newline, which E2B's server joins end to end
// ("Traceback (most recent call last)Cell In [3]"); here each ends its
// line.
func joinTraceback(lines []string) string {
	var b strings.Builder
	for i, l := range lines {
		b.WriteString(l)
		if i < len(lines)-1 && !strings.HasSuffix(l, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// mimeFields maps Jupyter MIME types to the result fields of E2B's SDKs.
var mimeFields = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript",
	"e2b/data": "data", "e2b/chart": "chart",
}

// outputLine turns one kernel output into an NDJSON line (nil: none).
func outputLine(o jupyter.Output) map[string]any {
	switch o.Type {
	case "stream":
		var c struct{ Name, Text string }
		json.Unmarshal(o.Content, &c)
		typ := "stdout"
		if c.Name == "stderr" {
			typ = "stderr"
		}
		return map[string]any{"type": typ, "text": c.Text, "timestamp": now()}
	case "execute_result", "display_data":
		var c struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		json.Unmarshal(o.Content, &c)
		v := map[string]any{"type": "result", "is_main_result": o.Type == "execute_result"}
		extra := map[string]any{}
		for mime, raw := range c.Data {
			var val any
			json.Unmarshal(raw, &val)
			// Text-like values may arrive as lists of lines.
			if parts, ok := val.([]any); ok && mime != "application/json" {
				var sb strings.Builder
				for _, p := range parts {
					fmt.Fprint(&sb, p)
				}
				val = sb.String()
			}
			switch mime {
			case "text/plain":
				// As E2B's server does: 'bar' reads as bar.
				if t, ok := val.(string); ok && len(t) >= 2 && (t[0] == '\'' || t[0] == '"') && t[len(t)-1] == t[0] {
					val = t[1 : len(t)-1]
				}
			case "image/png", "image/jpeg", "application/pdf":
				// Some encoders end base64 with a newline.
				if t, ok := val.(string); ok {
					val = strings.TrimSpace(t)
				}
			}
			if f, ok := mimeFields[mime]; ok {
				v[f] = val
			} else {
				extra[mime] = val
			}
		}
		v["extra"] = extra
		return v
	case "error":
		var c struct {
			Ename     string   `json:"ename"`
			Evalue    string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		json.Unmarshal(o.Content, &c)
		return map[string]any{"type": "error", "name": c.Ename, "value": c.Evalue, "traceback": joinTraceback(c.Traceback)}
	case "execute_input":
		var c struct {
			Count int `json:"execution_count"`
		}
		json.Unmarshal(o.Content, &c)
		return map[string]any{"type": "number_of_executions", "execution_count": c.Count}
	}
	return nil
}
