package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// LocalAPI is a node daemon's own API, as its registration uses it: the
// registration runs beside the daemon (cmd/airlock-cluster), so that
// Kubernetes' client packages stay out of the airlock binary.
type LocalAPI struct {
	URL string // http://127.0.0.1:PORT
	Key string
}

var localClient = &http.Client{Timeout: 10 * time.Second}

func (l *LocalAPI) do(ctx context.Context, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, l.URL+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-KEY", l.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := localClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	return data, nil
}

// status is the node's load: its running sandboxes and its pools.
func (l *LocalAPI) status(ctx context.Context) (NodeStatus, error) {
	data, err := l.do(ctx, http.MethodGet, "/airlock/pools", nil)
	if err != nil {
		return NodeStatus{}, err
	}
	var got struct {
		Running int          `json:"running"`
		Pools   []PoolStatus `json:"pools"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		return NodeStatus{}, fmt.Errorf("the node's pools: %v", err)
	}
	st := NodeStatus{Sandboxes: got.Running, Pools: got.Pools, Templates: []TemplateStatus{}}
	if st.Pools == nil {
		st.Pools = []PoolStatus{}
	}
	return st, nil
}

// setPoolSize sets template's pool size on the node; a negative size
// returns it to the node's configuration.
func (l *LocalAPI) setPoolSize(ctx context.Context, template string, size int) error {
	path := "/airlock/pools/" + url.PathEscape(template)
	if size < 0 {
		_, err := l.do(ctx, http.MethodDelete, path, nil)
		return err
	}
	_, err := l.do(ctx, http.MethodPut, path, map[string]int{"size": size})
	return err
}
