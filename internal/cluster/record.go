package cluster

import (
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ParseAddress checks a node's address, as an AirlockNode's spec.address
// gives it and as a node advertises it: http or https, a host (a DNS
// name, an IPv4 address or a bracketed IPv6 one) and an optional port
// from 1 to 65535, nothing else. It returns the URL that requests to the
// node are sent to. Anyone who may write AirlockNodes writes what the
// routers read here, so it is checked whole, not trusted to the CRD's
// pattern: an address that url.Parse refuses once made the proxy
// dereference a nil URL.
func ParseAddress(s string) (*url.URL, error) {
	if len(s) > 256 {
		return nil, fmt.Errorf("node address is longer than 256 bytes")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("node address %q is not a URL", s)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("node address %q: the scheme must be http or https", s)
	case u.Opaque != "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawPath != "" ||
		u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawFragment != "":
		return nil, fmt.Errorf("node address %q: give only scheme://host[:port]", s)
	}
	host, port := u.Hostname(), u.Port()
	if !validHost(host, strings.HasPrefix(u.Host, "[")) {
		return nil, fmt.Errorf("node address %q: %q is not a host name or an IP address", s, host)
	}
	if port != "" || strings.HasSuffix(u.Host, ":") {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port[0] == '0' {
			return nil, fmt.Errorf("node address %q: the port must be a number from 1 to 65535", s)
		}
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host}, nil
}

// validHost reports whether h is a DNS name or an IPv4 address, or, if
// it was bracketed, an IPv6 address without a zone.
func validHost(h string, bracketed bool) bool {
	if bracketed {
		a, err := netip.ParseAddr(h)
		return err == nil && a.Is6() && a.Zone() == ""
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Is4()
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// parseNode reads a registered node from its AirlockNode u and its Lease:
// what the routers place and route by. A record that cannot be routed to
// is an error, and the router leaves the node out.
func parseNode(u, lease *unstructured.Unstructured) (known, error) {
	k := known{expires: leaseExpiry(lease)}
	renewed, _, _ := unstructured.NestedString(lease.Object, "spec", "renewTime")
	k.renewed, _ = time.Parse(time.RFC3339Nano, renewed)
	n := node{Name: u.GetName(), Ready: map[string]int{}}
	address, _, _ := unstructured.NestedString(u.Object, "spec", "address")
	target, err := ParseAddress(address)
	if err != nil {
		return known{}, err
	}
	n.Address, n.target = target.String(), target
	// The prefix is computed, not read: a node's record cannot claim
	// another's sandboxes.
	n.Prefix = IDPrefix(u.GetName())
	c, _, _ := unstructured.NestedInt64(u.Object, "spec", "capacity")
	sb, _, _ := unstructured.NestedInt64(u.Object, "status", "sandboxes")
	n.Capacity, n.Sandboxes = int(max(c, 0)), int(max(sb, 0))
	pools, _, _ := unstructured.NestedSlice(u.Object, "status", "pools")
	for _, p := range pools {
		m, _ := p.(map[string]any)
		t, _ := m["template"].(string)
		r, _ := m["ready"].(int64)
		n.Ready[t] = int(max(r, 0))
	}
	builds, _, _ := unstructured.NestedSlice(u.Object, "status", "templates")
	n.Templates = map[string]TemplateStatus{}
	for _, b := range builds {
		m, _ := b.(map[string]any)
		var t TemplateStatus
		t.Name, _ = m["name"].(string)
		t.Generation, _ = m["generation"].(int64)
		t.Phase, _ = m["phase"].(string)
		t.Message, _ = m["message"].(string)
		t.BuildID, _ = m["buildID"].(string)
		t.LocalBuildID, _ = m["localBuildID"].(string)
		n.Templates[t.Name] = t
	}
	k.node = n
	return k, nil
}
