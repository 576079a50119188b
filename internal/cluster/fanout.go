package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// fanOut sends r to every live node at once and returns the answers of
// those that gave one.
func (rt *Router) fanOut(r *http.Request) []answer {
	nodes := rt.nodes.live()
	answers := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
			defer cancel()
			resp, err := rt.send(ctx, n, r, nil)
			if err != nil {
				if nodeGone(err) {
					rt.nodes.failed(n.Name)
				}
				rt.log.Warn("router: fan-out", "node", n.Name, "path", r.URL.Path, "err", err)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
			if err == nil {
				answers[i] = answer{node: n, status: resp.StatusCode, header: resp.Header, body: body}
			}
		})
	}
	wg.Wait()
	return slices.DeleteFunc(answers, func(a answer) bool { return a.status == 0 })
}

type answer struct {
	node   node
	status int
	header http.Header
	body   []byte
}

// fanOutOK is fanOut's answers if every node took the request; else it
// relays the first refusal (every node checks a request the same way, so
// one's refusal is every one's) and returns false.
func (rt *Router) fanOutOK(w http.ResponseWriter, r *http.Request) ([]answer, bool) {
	answers := rt.fanOut(r)
	for _, a := range answers {
		if a.status/100 != 2 {
			relay(w, a)
			return nil, false
		}
	}
	return answers, true
}

// list merges the nodes' lists. Their order and page tokens are the
// same on every node (start time, then id), so a page of the cluster is
// the first limit of the nodes' pages merged, and the token of its last.
func (rt *Router) list(w http.ResponseWriter, r *http.Request) {
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	type item struct {
		raw       json.RawMessage
		id        string
		startedAt time.Time
	}
	var items []item
	more := false
	for _, a := range answers {
		var page []json.RawMessage
		if err := json.Unmarshal(a.body, &page); err != nil {
			rt.log.Warn("router: list", "node", a.node.Name, "err", err)
			continue
		}
		more = more || a.header.Get("X-Next-Token") != ""
		for _, raw := range page {
			var it struct {
				SandboxID string    `json:"sandboxID"`
				StartedAt time.Time `json:"startedAt"`
			}
			json.Unmarshal(raw, &it)
			items = append(items, item{withDomain(raw, rt.domain), it.SandboxID, it.StartedAt})
		}
	}
	asc := r.URL.Query().Get("order") == "asc"
	slices.SortFunc(items, func(a, b item) int {
		c := a.startedAt.Compare(b.startedAt)
		if c == 0 {
			c = strings.Compare(a.id, b.id)
		}
		if asc {
			return c
		}
		return -c
	})
	if l, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && l > 0 && l < len(items) {
		items, more = items[:l], true
	}
	if more && len(items) > 0 {
		last := items[len(items)-1]
		w.Header().Set("X-Next-Token", strconv.FormatInt(last.startedAt.UnixNano(), 10)+"."+last.id)
	}
	out := make([]json.RawMessage, len(items))
	for i, it := range items {
		out[i] = bytes.TrimSpace(it.raw)
	}
	writeJSON(w, http.StatusOK, out)
}

// listSnapshots merges the nodes' snapshots; each lives on the node that
// took it, and a create from it finds that node (create's fallback).
func (rt *Router) listSnapshots(w http.ResponseWriter, r *http.Request) {
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	out := []json.RawMessage{}
	for _, a := range answers {
		var page []json.RawMessage
		if json.Unmarshal(a.body, &page) == nil {
			out = append(out, page...)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// metricsList merges the nodes' metrics of the sandboxes a request
// names: each node answers for those it runs and leaves out the others.
func (rt *Router) metricsList(w http.ResponseWriter, r *http.Request) {
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	out := map[string]json.RawMessage{}
	for _, a := range answers {
		var got struct {
			Sandboxes map[string]json.RawMessage `json:"sandboxes"`
		}
		if json.Unmarshal(a.body, &got) == nil {
			maps.Copy(out, got.Sandboxes)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// pools lists every node's pools, each naming its node.
func (rt *Router) pools(w http.ResponseWriter, r *http.Request) {
	answers, ok := rt.fanOutOK(w, r)
	if !ok {
		return
	}
	out := []map[string]any{}
	var budget int64
	for _, a := range answers {
		var got struct {
			Pools  []map[string]any `json:"pools"`
			Budget int64            `json:"memoryBudgetBytes"`
		}
		if json.Unmarshal(a.body, &got) != nil {
			continue
		}
		for _, p := range got.Pools {
			p["node"] = a.node.Name
			out = append(out, p)
		}
		budget += got.Budget
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": out, "memoryBudgetBytes": budget})
}
