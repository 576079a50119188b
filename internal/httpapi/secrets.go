package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/publicsuffix"

	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/secret"
)

// HandleSecrets serves E2B's Secret API over store: values go in and are
// never read back; egress rules name secrets by their placeholders.
func (s *Server) HandleSecrets(store *secret.Store) {
	s.secrets = store
	s.api("POST /secrets", s.createSecret)
	s.api("GET /secrets", s.listSecrets)
	s.api("GET /secrets/{id}", s.getSecret)
	s.api("POST /secrets/{id}", s.updateSecret)
	s.api("DELETE /secrets/{id}", s.deleteSecret)
}

// secretJSON is E2B's Secret: never the value.
type secretJSON struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

func secretObject(i secret.Info) secretJSON {
	return secretJSON{SecretID: i.ID, Name: i.Name, CurrentVersion: i.Version, Metadata: i.Metadata,
		CreatedAt: i.Created.UTC(), UpdatedAt: i.Updated.UTC()}
}

// secretBody is E2B's NewSecret and SecretUpdate.
type secretBody struct {
	Name     string            `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

func (s *Server) readSecret(w http.ResponseWriter, r *http.Request, fields []string) (secretBody, bool) {
	var b secretBody
	raw, ok := readBody(w, r)
	if !ok {
		return b, false
	}
	if err := refuseUnknown(raw, fields, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return b, false
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return b, false
	}
	if b.Value == nil {
		writeError(w, http.StatusBadRequest, "value is required")
		return b, false
	}
	return b, true
}

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) {
	b, ok := s.readSecret(w, r, []string{"name", "value", "metadata"})
	if !ok {
		return
	}
	info, err := s.secrets.Create(b.Name, *b.Value, b.Metadata)
	if err != nil {
		s.secretError(w, err)
		return
	}
	s.log.Info("secret created", "secret", info.ID, "name", info.Name)
	writeJSON(w, http.StatusCreated, secretObject(info))
}

func (s *Server) updateSecret(w http.ResponseWriter, r *http.Request) {
	b, ok := s.readSecret(w, r, []string{"value", "metadata"})
	if !ok {
		return
	}
	info, err := s.secrets.Update(r.PathValue("id"), *b.Value, b.Metadata)
	if err != nil {
		s.secretError(w, err)
		return
	}
	s.log.Info("secret updated", "secret", info.ID, "version", info.Version)
	writeJSON(w, http.StatusOK, secretObject(info))
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request) {
	info, err := s.secrets.Get(r.PathValue("id"))
	if err != nil {
		s.secretError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, secretObject(info))
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.secrets.Delete(r.PathValue("id")); err != nil {
		s.secretError(w, err)
		return
	}
	s.log.Info("secret deleted", "secret", r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
}

// listSecrets is a page of secrets, the next page's token in
// X-Next-Token, as E2B's paginated lists.
func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, "limit must be a positive number")
			return
		}
		limit = n
	}
	page, next, err := s.secrets.List(limit, r.URL.Query().Get("nextToken"))
	if err != nil {
		s.secretError(w, err)
		return
	}
	out := make([]secretJSON, 0, len(page))
	for _, i := range page {
		out = append(out, secretObject(i))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// secretError answers the store's errors on /secrets.
func (s *Server) secretError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, secret.ErrNotFound):
		writeError(w, http.StatusNotFound, "secret not found")
	case errors.Is(err, secret.ErrExists):
		writeError(w, http.StatusConflict, "%v", err)
	case errors.Is(err, secret.ErrInvalid):
		writeError(w, http.StatusBadRequest, "%v", err)
	default:
		s.log.Error("secret request failed", "err", err)
		writeError(w, http.StatusInternalServerError, "internal error: the secret operation failed (the server log has the details)")
	}
}

// checkRules parses E2B's network.rules and checks that every secret
// they name exists: a typo is refused now, not found at the first
// request (which would then be refused).
func (s *Server) checkRules(raw map[string][]ruleJSON) (map[string][]policy.Transform, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	in := make(map[string][]policy.Transform, len(raw))
	for host, rules := range raw {
		for _, r := range rules {
			if r.Transform != nil {
				in[host] = append(in[host], *r.Transform)
			} else {
				in[host] = append(in[host], policy.Transform{})
			}
		}
	}
	rules, err := policy.ParseTransforms(in)
	if err != nil {
		return nil, err
	}
	for host := range rules {
		// A wildcard over a suffix anyone can register under (com,
		// github.io) would send the rule's secret to any of them, with a
		// valid certificate.
		if base, ok := strings.CutPrefix(host, "*."); ok {
			if suffix, _ := publicsuffix.PublicSuffix(base); suffix == base {
				return nil, fmt.Errorf("network.rules: host %q: %q is a public suffix, under which anyone can have a name", host, base)
			}
		}
	}
	for host, ts := range rules {
		for _, t := range ts {
			for header, value := range t.Headers {
				names, _ := policy.SecretsIn(value)
				for _, name := range names {
					if s.secrets == nil {
						return nil, errors.New("network.rules: this server keeps no secrets")
					}
					if _, err := s.secrets.Get(name); err != nil {
						return nil, errors.New("network.rules: host " + strconv.Quote(host) + ", header " + strconv.Quote(header) + ": no secret named " + strconv.Quote(name))
					}
				}
			}
		}
	}
	return rules, nil
}
