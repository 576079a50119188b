package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// Transform is what the egress proxy does to a request the sandbox sends
// to a host that a rule names (E2B's network.rules): headers set, each
// replacing any of the same name the sandbox sent. A header's value may
// hold placeholders, ${e2b.secrets.NAME}, that the proxy fills in with
// the secret's value as the request leaves the host: the sandbox never
// holds it.
type Transform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// Limits of a policy's rules: each request to a host with rules is
// matched against them, and each header is sent on every request.
const (
	maxRuleHosts      = 64
	maxHostTransforms = 16
	maxHeaders        = 32
	maxHeaderBytes    = 8 << 10
)

// SecretPrefix and identityPrefix open the placeholders a header value
// may hold; a placeholder ends at the next '}'.
const (
	SecretPrefix   = "${e2b.secrets."
	identityPrefix = "${e2b.identity.tokens."
)

// headersNotSet are the headers a rule may not set: they frame the
// request or the connection, which are the proxy's to make.
var headersNotSet = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection",
	"Keep-Alive", "Upgrade", "Te", "Trailer", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate"}

// ParseTransforms checks E2B's rules (host → transforms) and returns
// them with each host lower-cased, as E2B stores them. A host is an
// exact name or one leading "*." (every name below it, not itself).
func ParseTransforms(rules map[string][]Transform) (map[string][]Transform, error) {
	if len(rules) > maxRuleHosts {
		return nil, fmt.Errorf("%d hosts with rules: at most %d are allowed", len(rules), maxRuleHosts)
	}
	out := make(map[string][]Transform, len(rules))
	for _, host := range slices.Sorted(maps.Keys(rules)) {
		key := strings.ToLower(strings.TrimSuffix(host, "."))
		if err := checkName(strings.TrimPrefix(key, "*.")); err != nil {
			return nil, fmt.Errorf("rules: host %q: %v", host, err)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("rules: host %q is given twice", key)
		}
		ts := rules[host]
		if len(ts) > maxHostTransforms {
			return nil, fmt.Errorf("rules: host %q has %d rules: at most %d are allowed", host, len(ts), maxHostTransforms)
		}
		kept := make([]Transform, 0, len(ts))
		for _, t := range ts {
			if err := t.check(); err != nil {
				return nil, fmt.Errorf("rules: host %q: %v", host, err)
			}
			kept = append(kept, Transform{Headers: maps.Clone(t.Headers)})
		}
		out[key] = kept
	}
	return out, nil
}

func (t Transform) check() error {
	if len(t.Headers) > maxHeaders {
		return fmt.Errorf("%d headers: at most %d are allowed", len(t.Headers), maxHeaders)
	}
	size := 0
	for name, value := range t.Headers {
		size += len(name) + len(value)
		if !validHeaderName(name) {
			return fmt.Errorf("header %q is not a valid header name", name)
		}
		if slices.Contains(headersNotSet, http.CanonicalHeaderKey(name)) {
			return fmt.Errorf("header %q frames the request or the connection: a rule cannot set it", name)
		}
		if !ValidHeaderValue(value) {
			return fmt.Errorf("header %q: its value holds a character a header cannot carry", name)
		}
		if strings.Contains(value, identityPrefix) {
			return fmt.Errorf("header %q: workload identity tokens (iam) are not supported by this server", name)
		}
		if _, err := SecretsIn(value); err != nil {
			return fmt.Errorf("header %q: %v", name, err)
		}
	}
	if size > maxHeaderBytes {
		return fmt.Errorf("headers of %d bytes: at most %d are allowed", size, maxHeaderBytes)
	}
	return nil
}

// SecretsIn returns the names of the secrets value's placeholders name,
// in order.
func SecretsIn(value string) ([]string, error) {
	var names []string
	for rest := value; ; {
		i := strings.Index(rest, SecretPrefix)
		if i < 0 {
			return names, nil
		}
		rest = rest[i+len(SecretPrefix):]
		name, after, ok := strings.Cut(rest, "}")
		if !ok || name == "" {
			return nil, errors.New("a secret placeholder is not closed: ${e2b.secrets.NAME}")
		}
		names = append(names, strings.ToLower(name))
		rest = after
	}
}

// Fill returns value with each secret placeholder replaced by what
// secret gives for its name.
func Fill(value string, secret func(name string) (string, error)) (string, error) {
	var b strings.Builder
	for rest := value; ; {
		i := strings.Index(rest, SecretPrefix)
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		b.WriteString(rest[:i])
		name, after, ok := strings.Cut(rest[i+len(SecretPrefix):], "}")
		if !ok || name == "" {
			return "", errors.New("a secret placeholder is not closed")
		}
		v, err := secret(strings.ToLower(name))
		if err != nil {
			return "", err
		}
		b.WriteString(v)
		rest = after
	}
}

// TransformsFor returns the transforms for a request to host (lower
// case, no final dot), by E2B's precedence: the exact name's, else the
// longest matching wildcard's; sets are never merged. Nil: none.
func (n *Network) TransformsFor(host string) []Transform {
	if strings.Contains(host, "*") {
		return nil // a name asked for is never a pattern
	}
	if ts, ok := n.Rules[host]; ok {
		return ts
	}
	best := ""
	for pattern := range n.Rules {
		if strings.HasPrefix(pattern, "*.") && strings.HasSuffix(host, pattern[1:]) && len(pattern) > len(best) {
			best = pattern
		}
	}
	if best == "" {
		return nil
	}
	return n.Rules[best]
}

// validHeaderName reports whether name is an HTTP token (RFC 9110 5.1).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ValidHeaderValue reports whether v may be an HTTP header's value: no
// control character but the tab (RFC 9110 5.5).
func ValidHeaderValue(v string) bool {
	for _, c := range []byte(v) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
