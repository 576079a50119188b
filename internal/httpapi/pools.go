package httpapi

import (
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Pools of ready sandboxes, Airlock's own: their state for the console,
// and their sizes set at run time.

// pools is Airlock's own: the pools, for the console.
func (s *Server) pools(w http.ResponseWriter, r *http.Request) {
	pools, budget := s.m.Pools(r.Context())
	if pools == nil {
		pools = []sandbox.PoolStatus{}
	}
	running, _ := s.m.Counts()
	n := 0
	for _, c := range running {
		n += c
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": pools, "memoryBudgetBytes": budget, "running": n})
}

// MaxPoolSize bounds a pool's size set through the API.
const MaxPoolSize = 256

func (s *Server) setPoolSize(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"size"}, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var body struct {
		Size *int `json:"size"`
	}
	if !unmarshal(w, raw, &body) {
		return
	}
	if body.Size == nil || *body.Size < 0 || *body.Size > MaxPoolSize {
		writeError(w, http.StatusBadRequest, "size must be an integer from 0 to %d", MaxPoolSize)
		return
	}
	s.m.SetPoolSize(r.PathValue("template"), *body.Size)
	w.WriteHeader(http.StatusNoContent)
}

// resetPoolSize sets a pool's size back to the configuration's.
func (s *Server) resetPoolSize(w http.ResponseWriter, r *http.Request) {
	s.m.SetPoolSize(r.PathValue("template"), -1)
	w.WriteHeader(http.StatusNoContent)
}
