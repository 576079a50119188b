package cluster

import (
	"encoding/json"
	"hash/fnv"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Volumes in a cluster. A volume lives on the node that made it, whose
// id prefix its id begins with (a UUID's first six hex digits: package
// volume). The router sends what names a volume's id to that node (the
// files, by the volume's token, which the node checks), fans the list
// out, places a new volume on the node its name hashes to among the live
// ones once no node has that name, and places a sandbox that mounts
// volumes on the node that has them.

// volumeNode is the live node of volume id.
func (rt *Router) volumeNode(id string) (node, bool) {
	if len(id) < 6 {
		return node{}, false
	}
	return rt.nodes.byPrefix(strings.ToLower(id[:6]))
}

// toVolume passes r to the node of volume id.
func (rt *Router) toVolume(w http.ResponseWriter, r *http.Request, id string) {
	n, ok := rt.volumeNode(id)
	if !ok {
		writeError(w, http.StatusNotFound, "volume not found")
		return
	}
	rt.proxyTo(w, r, route{node: n, id: id})
}

// volumeContent routes /volumecontent/{id}/…, which carries the volume's
// token rather than the API key.
func (rt *Router) volumeContent(w http.ResponseWriter, r *http.Request) {
	id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/volumecontent/"), "/")
	n, ok := rt.volumeNode(id)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"code": "VOLUME_NOT_FOUND", "message": "volume not found"})
		return
	}
	rt.proxyTo(w, r, route{node: n, id: id})
}

type listedVolume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

// volumes are every live node's volumes, by name, with their node; ok
// false if a node refused the list (relayed to w).
func (rt *Router) volumes(w http.ResponseWriter, r *http.Request) (map[string]node, []listedVolume, bool) {
	list, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "/volumes", nil)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "%v", err)
		return nil, nil, false
	}
	list.Header = r.Header.Clone()
	answers, ok := rt.fanOutOK(w, list)
	if !ok {
		return nil, nil, false
	}
	byName := map[string]node{}
	var all []listedVolume
	for _, a := range answers {
		var vs []listedVolume
		if err := json.Unmarshal(a.body, &vs); err != nil {
			writeError(w, http.StatusBadGateway, "node %s answered the volume list with something else", a.node.Name)
			return nil, nil, false
		}
		for _, v := range vs {
			byName[v.Name] = a.node
		}
		all = append(all, vs...)
	}
	return byName, all, true
}

func (rt *Router) listVolumes(w http.ResponseWriter, r *http.Request) {
	_, all, ok := rt.volumes(w, r)
	if !ok {
		return
	}
	slices.SortFunc(all, func(a, b listedVolume) int { return strings.Compare(a.Name, b.Name) })
	if all == nil {
		all = []listedVolume{}
	}
	writeJSON(w, http.StatusOK, all)
}

// createVolume places a new volume: on the node its name hashes to among
// the live ones, the next one if that one is not reached. A name that a
// node has already is refused as the node would (a node checks its own).
func (rt *Router) createVolume(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body over %d bytes", maxBody)
		return
	}
	var req struct {
		Name string `json:"name"`
	}
	json.Unmarshal(body, &req) // the node names what is wrong with it
	byName, _, ok := rt.volumes(w, r)
	if !ok {
		return
	}
	if _, taken := byName[req.Name]; taken && req.Name != "" {
		writeError(w, http.StatusBadRequest, "volume with name %q already exists", req.Name)
		return
	}
	nodes := rt.nodes.live()
	if len(nodes) == 0 {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "no live Airlock node: none has registered, or every one's lease ran out")
		return
	}
	slices.SortFunc(nodes, func(a, b node) int { return strings.Compare(a.Name, b.Name) })
	h := fnv.New32a()
	h.Write([]byte(req.Name))
	first := int(h.Sum32() % uint32(len(nodes)))
	for i := range nodes {
		n := nodes[(first+i)%len(nodes)]
		resp, err := rt.send(r.Context(), n, r, body)
		if err != nil {
			if nodeGone(err) {
				rt.nodes.failed(n.Name)
			}
			if dialFailed(err) {
				continue
			}
			writeError(w, http.StatusBadGateway, "the node chosen for the volume did not answer")
			return
		}
		defer resp.Body.Close()
		respBody, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err != nil {
			writeError(w, http.StatusBadGateway, "the node chosen for the volume did not answer")
			return
		}
		copyHeader(w.Header(), resp.Header)
		w.Header().Set("Content-Length", strconv.Itoa(len(respBody)))
		w.WriteHeader(resp.StatusCode)
		w.Write(respBody)
		return
	}
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "no Airlock node took the volume: every one failed to answer")
}

// volumeHome is the node whose volumes a create mounts (body's
// volumeMounts), ok false with nothing mounted. Volumes of several nodes
// cannot be mounted together; an unknown name is left to the node to
// refuse.
func (rt *Router) volumeHome(w http.ResponseWriter, r *http.Request, body []byte) (home *node, answered bool) {
	var req struct {
		VolumeMounts []struct {
			Name string `json:"name"`
		} `json:"volumeMounts"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.VolumeMounts) == 0 {
		return nil, false
	}
	byName, _, ok := rt.volumes(w, r)
	if !ok {
		return nil, true
	}
	var names []string
	for _, m := range req.VolumeMounts {
		n, ok := byName[m.Name]
		if !ok {
			continue
		}
		if home != nil && n.Name != home.Name {
			writeError(w, http.StatusBadRequest, "invalid mounts: volumes %s and %s live on different nodes: a sandbox mounts the volumes of one node", strings.Join(names, ", "), m.Name)
			return nil, true
		}
		home, names = &n, append(names, m.Name)
	}
	return home, false
}
