package httpapi

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The pools, for the console: behind the key, one row per template.
func TestPools(t *testing.T) {
	a := newAPI(t, sandbox.Config{})
	code, _, _ := a.do("GET", "/airlock/pools", nil, nil)
	if code != http.StatusUnauthorized {
		t.Errorf("pools without the key: %d", code)
	}
	code, data := a.call("GET", "/airlock/pools", nil)
	var body struct {
		Pools []sandbox.PoolStatus `json:"pools"`
	}
	if code != http.StatusOK || json.Unmarshal(data, &body) != nil || len(body.Pools) != 1 || body.Pools[0].Template != "base" {
		t.Errorf("pools: %d %s", code, data)
	}
	// A size set at run time, and back to the configuration.
	sizeOf := func() int {
		_, data := a.call("GET", "/airlock/pools", nil)
		json.Unmarshal(data, &body)
		return body.Pools[0].Size
	}
	configured := sizeOf()
	if code, data := a.call("PUT", "/airlock/pools/base", map[string]any{"size": configured + 2}); code != http.StatusNoContent {
		t.Fatalf("set pool size: %d %s", code, data)
	}
	if got := sizeOf(); got != configured+2 {
		t.Errorf("size %d after PUT, want %d", got, configured+2)
	}
	for _, bad := range []any{map[string]any{"size": -1}, map[string]any{"size": 257}, map[string]any{}, map[string]any{"size": 1, "nodes": 2}, "x"} {
		if code, data := a.call("PUT", "/airlock/pools/base", bad); code != http.StatusBadRequest {
			t.Errorf("PUT %v: %d %s, want 400", bad, code, data)
		}
	}
	if code, _ := a.call("DELETE", "/airlock/pools/base", nil); code != http.StatusNoContent {
		t.Errorf("DELETE: %d", code)
	}
	if got := sizeOf(); got != configured {
		t.Errorf("size %d after DELETE, want the configured %d", got, configured)
	}
}
