package process

import (
	"context"
	"net/http"
)

type listResponse struct {
	Processes []processInfo `json:"processes,omitempty"`
}

// List reports the processes running now.
func (s *Service) List(ctx context.Context, r *http.Request, _ *struct{}) (*listResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &listResponse{}
	for _, p := range s.m {
		resp.Processes = append(resp.Processes, p.info)
	}
	return resp, nil
}
