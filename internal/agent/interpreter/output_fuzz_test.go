package interpreter

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// FuzzOutputLine: whatever a kernel (code of the sandbox's) publishes
// becomes at most one NDJSON line of ASCII, which the daemon's reader
// (agentproto.ExecuteLine) decodes as the same kind, and which holds
// what json.Marshal would have written, the non-ASCII escaped.
func FuzzOutputLine(f *testing.F) {
	for _, seed := range []struct{ typ, content string }{
		{"stream", `{"name":"stdout","text":"hi\n"}`},
		{"stream", `{"name":"stderr","text":"ключ 😀 \u2028 \ud800"}`},
		{"stream", `{"name":1}`},
		{"execute_result", `{"data":{"text/plain":"'bar'","text/html":["<b>", "x", 1, null],"image/png":"iVBOR\n"}}`},
		{"display_data", `{"data":{"application/json":{"a":[1,2]},"e2b/chart":{"type":"line"},"x/custom":"y","text/plain":"\""}}`},
		{"display_data", `{"data":{"text/plain":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}}`},
		{"error", `{"ename":"ValueError","evalue":"bad","traceback":["a\n","b"]}`},
		{"error", `{"traceback":"not a list"}`},
		{"execute_input", `{"execution_count":3}`},
		{"execute_input", `{"execution_count":1e400}`},
		{"status", `{"execution_state":"idle"}`},
		{"stream", `not json`},
		{"stream", ``},
	} {
		f.Add(seed.typ, []byte(seed.content))
	}
	f.Fuzz(func(t *testing.T, typ string, content []byte) {
		v := outputLine(jupyter.Output{Type: typ, Content: content})
		if v == nil {
			return
		}
		line := asciiJSON(v)
		for i, c := range line {
			if c >= 0x80 || c == '\n' || c == '\r' {
				t.Fatalf("line %q: byte %d is %#x: not one line of ASCII", line, i, c)
			}
		}
		var got agentproto.ExecuteLine
		if err := json.Unmarshal(line, &got); err != nil || got.Type != v["type"] {
			t.Fatalf("line %q read as %+v (%v), want type %v", line, got, err, v["type"])
		}
		// The same values as json.Marshal's, escaped or not.
		plain, _ := json.Marshal(v)
		var want, back any
		if err := json.Unmarshal(plain, &want); err != nil {
			t.Fatal(err)
		}
		json.Unmarshal(line, &back)
		if !reflect.DeepEqual(want, back) {
			t.Errorf("the ASCII line %q holds %v, json.Marshal's %q holds %v", line, back, plain, want)
		}
	})
}

// FuzzASCIIJSON: any string is written as ASCII that decodes to what
// json.Marshal writes of it (invalid UTF-8 replaced, as json does), and
// that holds nothing a line break ends.
func FuzzASCIIJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "ключ", "😀", "\u2028\u2029", "\xff\xfe", "\x00\n\r\t", "\ud7ff\ue000\U0010ffff", "a\"b\\c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := asciiJSON(map[string]any{"text": s})
		if bytes.ContainsFunc(out, func(r rune) bool { return r >= 0x80 || r == '\n' || r == '\r' }) {
			t.Fatalf("%q written as %q: not one line of ASCII", s, out)
		}
		plain, _ := json.Marshal(s)
		var want string
		json.Unmarshal(plain, &want)
		var got struct{ Text string }
		if err := json.Unmarshal(out, &got); err != nil || got.Text != want {
			t.Errorf("%q written as %q, read back as %q (%v), want %q", s, out, got.Text, err, want)
		}
	})
}
