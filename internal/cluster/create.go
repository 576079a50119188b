package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// create places a new sandbox: on a node with a ready pooled sandbox of
// the template (the most ready first), else on the least loaded. A node
// that is full, shutting down, unreachable or without the template hands
// the create to the next.
func (rt *Router) create(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body over %d bytes", maxBody)
		return
	}
	var req struct {
		TemplateID string `json:"templateID"`
	}
	json.Unmarshal(body, &req) // the node names what is wrong with it
	template := req.TemplateID
	if template == "" {
		template = "base"
	}
	candidates := placement(rt.nodes.live(), template)
	// A sandbox that mounts volumes goes where they are.
	if home, answered := rt.volumeHome(w, r, body); answered {
		return
	} else if home != nil {
		candidates = []node{*home}
	}
	if len(candidates) == 0 {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "no live Airlock node: none has registered, or every one's lease ran out")
		return
	}
	var last *http.Response
	var lastBody []byte
	for _, n := range candidates {
		// Counted from now, not from the answer: concurrent creates
		// spread rather than all pick the node that looked best.
		rt.nodes.placed(n.Name, template)
		resp, err := rt.send(r.Context(), n, r, body)
		if err != nil {
			rt.log.Warn("router: create", "node", n.Name, "err", err)
			if nodeGone(err) {
				rt.nodes.failed(n.Name)
			}
			if dialFailed(err) {
				continue // never sent: another node may take it
			}
			// Sent, perhaps made: a second create elsewhere could leave
			// one that nobody knows of.
			writeError(w, http.StatusBadGateway, "the node chosen for the sandbox did not answer")
			return
		}
		respBody, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		if err != nil {
			writeError(w, http.StatusBadGateway, "the node chosen for the sandbox did not answer")
			return
		}
		last, lastBody = resp, respBody
		if !tryNext(resp.StatusCode, respBody) {
			break
		}
	}
	if last == nil {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "no Airlock node took the sandbox: every one failed to answer")
		return
	}
	if last.StatusCode/100 == 2 {
		lastBody = withDomain(lastBody, rt.domain)
	}
	copyHeader(w.Header(), last.Header)
	w.Header().Set("Content-Length", strconv.Itoa(len(lastBody)))
	w.WriteHeader(last.StatusCode)
	w.Write(lastBody)
}

// tryNext says whether a node's answer to a create leaves it to another:
// full (429), shutting down or short of host room (503), or without the
// template, which another node may have.
func tryNext(status int, body []byte) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	case http.StatusBadRequest:
		return bytes.Contains(body, []byte("unknown template"))
	}
	return false
}

// placement orders the nodes for a create of template: those with ready
// pooled sandboxes of it first, most ready first; then by load.
func placement(nodes []node, template string) []node {
	load := func(n node) float64 {
		if n.Capacity <= 0 {
			return float64(n.Sandboxes)
		}
		return float64(n.Sandboxes) / float64(n.Capacity)
	}
	slices.SortStableFunc(nodes, func(a, b node) int {
		ra, rb := a.Ready[template], b.Ready[template]
		switch {
		case ra > 0 && rb == 0:
			return -1
		case rb > 0 && ra == 0:
			return 1
		}
		if la, lb := load(a), load(b); la != lb {
			if la < lb {
				return -1
			}
			return 1
		}
		if ra != rb {
			return rb - ra
		}
		return strings.Compare(a.Name, b.Name)
	})
	return nodes
}

// send passes r, with body, to node n and returns its answer.
func (rt *Router) send(ctx context.Context, n node, r *http.Request, body []byte) (*http.Response, error) {
	u := strings.TrimSuffix(n.Address, "/") + r.URL.RequestURI()
	out, err := http.NewRequestWithContext(ctx, r.Method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"X-API-KEY", "Authorization", "Content-Type", "Accept", "User-Agent", "E2B-Traffic-Access-Token", "X-Access-Token"} {
		if v := r.Header.Get(h); v != "" {
			out.Header.Set(h, v)
		}
	}
	return rt.client.Do(out)
}
