package agentproto

import "encoding/json"

// The code interpreter's messages (InterpreterPort): plain JSON, not
// Connect. POST ExecutePath takes an ExecuteRequest and answers NDJSON,
// one ExecuteLine a line.

// ExecutePath runs code in a context of the interpreter.
const ExecutePath = "/execute"

// ExecuteRequest runs code, in the context named or in the language's
// default one (naming both is refused).
type ExecuteRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}

// ExecuteLine is one line of an execution's answer, as a reader decodes
// it. Type says which fields are set:
//
//	stdout, stderr          Text, Timestamp
//	result                  one display's MIME bundle, by E2B's field names,
//	                        and IsMainResult (the cell's value, not a display)
//	error                   Name, Value, Traceback
//	number_of_executions    ExecutionCount
//	end_of_execution, unexpected_end_of_execution, keepalive: nothing more
//
// The agent writes these lines field by field rather than from this
// struct: each kind carries only its own fields, as E2B's server writes
// them (a Python SDK builds a result from every key of its line).
type ExecuteLine struct {
	Type      string `json:"type"`
	Text      string `json:"text,omitempty"`
	Timestamp string `json:"timestamp,omitempty"`

	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`

	ExecutionCount int `json:"execution_count,omitempty"`

	IsMainResult bool                       `json:"is_main_result,omitempty"`
	HTML         string                     `json:"html,omitempty"`
	Markdown     string                     `json:"markdown,omitempty"`
	SVG          string                     `json:"svg,omitempty"`
	PNG          string                     `json:"png,omitempty"` // base64
	JPEG         string                     `json:"jpeg,omitempty"`
	PDF          string                     `json:"pdf,omitempty"`
	LaTeX        string                     `json:"latex,omitempty"`
	JavaScript   string                     `json:"javascript,omitempty"`
	JSON         json.RawMessage            `json:"json,omitempty"`
	Data         json.RawMessage            `json:"data,omitempty"`
	Chart        json.RawMessage            `json:"chart,omitempty"`
	Extra        map[string]json.RawMessage `json:"extra,omitempty"`
}
