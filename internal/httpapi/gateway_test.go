package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func TestGatewayTokens(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(nil)
	other := a.create(nil)
	traffic := *c.TrafficAccessToken
	for _, tc := range []struct {
		name string
		port string
		hdr  http.Header
		want int
	}{
		{"envd without a token", agentproto.EnvdPort, nil, 401},
		{"envd with a wrong token", agentproto.EnvdPort, http.Header{"X-Access-Token": {"nope"}}, 401},
		{"envd with another sandbox's token", agentproto.EnvdPort, envd(other), 401},
		{"envd with the API key", agentproto.EnvdPort, http.Header{"X-Api-Key": {key}}, 401},
		{"envd with the traffic token", agentproto.EnvdPort, http.Header{"E2b-Traffic-Access-Token": {traffic}}, 401},
		{"envd with the access token", agentproto.EnvdPort, envd(c), 204},
		{"interpreter without a token", agentproto.InterpreterPort, nil, 401},
		{"interpreter with another's traffic token", agentproto.InterpreterPort, http.Header{"E2b-Traffic-Access-Token": {*other.TrafficAccessToken}}, 401},
		{"interpreter with the traffic token", agentproto.InterpreterPort, http.Header{"E2b-Traffic-Access-Token": {traffic}}, 200},
		{"interpreter with the access token", agentproto.InterpreterPort, envd(c), 200},
		{"a port nobody serves", "8080", envd(c), 502},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, data := a.gateway(c.SandboxID, tc.port, "GET", "/health", tc.hdr, nil)
			if code != tc.want {
				t.Fatalf("got %d %s, want %d", code, data, tc.want)
			}
			if code >= 400 {
				apiError(t, code, data)
			}
		})
	}

	// The agent's private endpoints stay private, however the path is put.
	for _, path := range []string{"/airlock/setup", "//airlock/setup", "/./airlock/setup", "/airlock/../airlock/setup", "/airlock%2Fsetup"} {
		code, data := a.gateway(c.SandboxID, agentproto.EnvdPort, "POST", path, envd(c), strings.NewReader(`{"envVars":{"LEAK":"1"}}`))
		if code == http.StatusNoContent {
			t.Errorf("POST %s through the gateway reached the agent's setup: %d %s", path, code, data)
		}
	}
	if out := a.run(c, `printf %s "$LEAK"`); out != "" {
		t.Errorf("a client set the sandbox's environment through the gateway: LEAK=%q", out)
	}

	if code, data := a.call("DELETE", "/sandboxes/"+c.SandboxID, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", code, data)
	}
	code, data := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", envd(c), nil)
	if code != http.StatusBadGateway {
		t.Errorf("a killed sandbox: %d %s, want 502", code, data)
	}
	apiError(t, code, data)
	// Without the gone sandbox's own token, it is indistinguishable from
	// a live one shown a wrong token, and so is an id never issued.
	wrong := "0" + c.EnvdAccessToken[1:] // one digit off
	if wrong == c.EnvdAccessToken {
		wrong = "1" + c.EnvdAccessToken[1:]
	}
	for _, probe := range []struct{ id, token string }{{c.SandboxID, wrong}, {"inope", c.EnvdAccessToken}, {c.SandboxID, ""}} {
		hdr := http.Header{"X-Access-Token": {probe.token}}
		if code, _ := a.gateway(probe.id, agentproto.EnvdPort, "GET", "/health", hdr, nil); code != http.StatusUnauthorized {
			t.Errorf("sandbox %s with token %q: %d, want 401", probe.id, probe.token, code)
		}
	}
	if code, _ := a.gateway(c.SandboxID, agentproto.InterpreterPort, "GET", "/health", http.Header{"E2B-Traffic-Access-Token": {*c.TrafficAccessToken}}, nil); code != http.StatusBadGateway {
		t.Errorf("a killed sandbox's interpreter port with its traffic token: %d, want 502", code)
	}
}

// frame is msg as one Connect envelope (agentproto's codec).
func frame(msg any) []byte {
	data, _ := json.Marshal(msg)
	var b bytes.Buffer
	agentproto.WriteEnvelope(&b, 0, data)
	return b.Bytes()
}

// readFrames reads envelopes up to the end of the stream and returns the
// messages and the end envelope's body.
func readFrames(r io.Reader) (msgs [][]byte, end []byte, err error) {
	for {
		flags, data, err := agentproto.ReadEnvelope(r, agentproto.MaxResponse)
		if err != nil {
			return msgs, nil, fmt.Errorf("stream ended without its end frame: %w", err)
		}
		if flags&agentproto.FlagEndStream != 0 {
			return msgs, data, nil
		}
		msgs = append(msgs, data)
	}
}

// run runs script with sh in sandbox c through the gateway and returns
// its stdout.
func (a *api) run(c created, script string) string {
	a.t.Helper()
	req, _ := http.NewRequestWithContext(a.t.Context(), "POST", a.url+"/process.Process/Start",
		bytes.NewReader(frame(map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", script}}})))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("E2b-Sandbox-Id", c.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", agentproto.EnvdPort)
	req.Header.Set("X-Access-Token", c.EnvdAccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	msgs, end, err := readFrames(resp.Body)
	if err != nil {
		a.t.Fatalf("run %q: %d: %v", script, resp.StatusCode, err)
	}
	if string(end) != "{}" {
		a.t.Fatalf("run %q: stream error %s", script, end)
	}
	var stdout []byte
	for _, m := range msgs {
		var ev struct {
			Event struct {
				Data *struct {
					Stdout string `json:"stdout"`
				} `json:"data"`
			} `json:"event"`
		}
		if err := json.Unmarshal(m, &ev); err != nil {
			a.t.Fatalf("run %q: message %s: %v", script, m, err)
		}
		if ev.Event.Data != nil {
			b, err := base64.StdEncoding.DecodeString(ev.Event.Data.Stdout)
			if err != nil {
				a.t.Fatal(err)
			}
			stdout = append(stdout, b...)
		}
	}
	return string(stdout)
}

func TestGatewayRunsCommandsWithTheSandboxEnv(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(map[string]any{"envVars": map[string]string{"GREETING": "hello there"}})
	if out := a.run(c, `printf %s "$GREETING"`); out != "hello there" {
		t.Errorf("stdout %q, want the sandbox's envVars", out)
	}
	if n := a.m.Metrics().Execs.Load(); n != 1 {
		t.Errorf("execs = %d, want 1", n)
	}
}

func TestGatewayAutoResume(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	c := a.create(map[string]any{"autoResume": map[string]any{"enabled": true}})
	if code, data := a.call("POST", "/sandboxes/"+c.SandboxID+"/pause", nil); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, data)
	}
	if code, data := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", envd(c), nil); code != http.StatusNoContent {
		t.Fatalf("gateway to an auto-resuming sandbox: %d %s, want 204", code, data)
	}
	if in := a.info(c.SandboxID); in.State != "running" {
		t.Errorf("state %q after traffic, want running", in.State)
	}
	// A request without the token resumes nothing.
	a.call("POST", "/sandboxes/"+c.SandboxID+"/pause", nil)
	if code, _ := a.gateway(c.SandboxID, agentproto.EnvdPort, "GET", "/health", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("gateway without a token: %d, want 401", code)
	}
	if in := a.info(c.SandboxID); in.State != "paused" {
		t.Errorf("state %q after an unauthorized request, want paused", in.State)
	}
}
