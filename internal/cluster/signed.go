package cluster

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// signedFile passes a signed file URL, which names no sandbox, to the
// node whose sandbox signed it: each node checks the signature against
// its own sandboxes, and only one can have made it. It is asked of each
// node in turn, so an upload's body is kept to be sent again: up to
// maxSignedUpload, and only a few at a time, for anyone can send one.
func (rt *Router) signedFile(w http.ResponseWriter, r *http.Request) {
	// What no node could open is refused here, in envd's words (the
	// nodes' too): the body E2B's users see.
	q := r.URL.Query()
	if r.Method != http.MethodGet && r.Method != http.MethodPost || !strings.HasPrefix(q.Get("signature"), "v1_") {
		writeError(w, http.StatusUnauthorized, "invalid signature")
		return
	}
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "Invalid format for parameter signature_expiration: want a Unix time in seconds")
			return
		}
		if time.Now().Unix() > n {
			writeError(w, http.StatusUnauthorized, "signature is already expired")
			return
		}
	}
	var body []byte
	if r.Method == http.MethodPost {
		select {
		case rt.uploads <- struct{}{}:
			defer func() { <-rt.uploads }()
		case <-r.Context().Done():
			return
		}
		// Anyone may send one: one sent slower than uploadRate is cut
		// off rather than hold a place.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadDeadline(maxSignedUpload)))
		var err error
		if body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxSignedUpload)); err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, "an upload through a signed URL to a cluster is limited to %d MiB: write larger files with files.write", maxSignedUpload>>20)
			return
		}
	}
	for _, n := range rt.nodes.live() {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, strings.TrimSuffix(n.Address, "/")+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			break
		}
		for _, h := range []string{"Content-Type", "Accept", "User-Agent"} {
			if v := r.Header.Get(h); v != "" {
				out.Header.Set(h, v)
			}
		}
		resp, err := rt.client.Do(out)
		if err != nil {
			continue
		}
		if resp.StatusCode == http.StatusUnauthorized {
			resp.Body.Close()
			continue // not this node's sandbox
		}
		defer resp.Body.Close()
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		return
	}
	writeError(w, http.StatusUnauthorized, "invalid signature")
}

// Signed uploads in a cluster: at most this large, this many at a time.
const (
	maxSignedUpload = 32 << 20
	signedUploads   = 4
)
