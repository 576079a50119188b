package interpreter

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agent/jupyter"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

func TestOutputLine(t *testing.T) {
	for _, tc := range []struct {
		typ, content string
		want         map[string]any
	}{
		{"stream", `{"name":"stderr","text":"x\n"}`, map[string]any{"type": "stderr", "text": "x\n"}},
		{"execute_result", `{"data":{"text/plain":"'bar'","text/html":["<b>", "x</b>"],"application/json":{"a":1},"image/png":"iVBO\n"},"execution_count":3}`,
			map[string]any{"type": "result", "is_main_result": true, "text": "bar", "html": "<b>x</b>",
				"json": map[string]any{"a": 1.0}, "png": "iVBO", "extra": map[string]any{}}},
		{"display_data", `{"data":{"text/plain":"<Figure>","application/x-custom":"z"}}`,
			map[string]any{"type": "result", "is_main_result": false, "text": "<Figure>", "extra": map[string]any{"application/x-custom": "z"}}},
		{"error", `{"ename":"E","evalue":"v","traceback":["a\n","b"]}`, map[string]any{"type": "error", "name": "E", "value": "v", "traceback": "a\nb"}},
		{"execute_input", `{"code":"1","execution_count":7}`, map[string]any{"type": "number_of_executions", "execution_count": 7}},
	} {
		got := outputLine(jupyter.Output{Type: tc.typ, Content: json.RawMessage(tc.content)})
		delete(got, "timestamp")
		// Compare through JSON, as the client sees it.
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(tc.want)
		var gm, wm any
		json.Unmarshal(g, &gm)
		json.Unmarshal(w, &wm)
		if !reflect.DeepEqual(gm, wm) {
			t.Errorf("%s %s:\n got  %s\n want %s", tc.typ, tc.content, g, w)
		}
		// The daemon reads the line as agentproto describes it.
		var line agentproto.ExecuteLine
		if err := json.Unmarshal(g, &line); err != nil || line.Type != got["type"] {
			t.Errorf("%s: %s does not read as an agentproto.ExecuteLine (%v)", tc.typ, g, err)
		}
	}
}

func TestASCIIJSON(t *testing.T) {
	in := map[string]any{"text": "héllo ✓ 🎉 <tag>"}
	out := asciiJSON(in)
	for _, b := range out {
		if b >= 0x80 {
			t.Fatalf("non-ASCII byte in %s", out)
		}
	}
	var back map[string]any
	if err := json.Unmarshal(out, &back); err != nil || back["text"] != in["text"] {
		t.Errorf("round trip: %v %q", err, back["text"])
	}
}
