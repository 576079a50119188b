package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// refuseUnknown returns an error naming the first field of the JSON
// object raw that is not in known and carries a value: a field this
// server does not implement is refused, never silently dropped, so that
// a client never believes a sandbox has what it asked for and has not.
// A field sent as null, {}, [], false or "" asks for nothing and passes,
// as newer SDKs send such defaults.
func refuseUnknown(raw []byte, known []string, where string) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		if where != "" {
			return fmt.Errorf("%s is not a JSON object", strings.TrimSuffix(where, "."))
		}
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if slices.Contains(known, k) || isEmptyJSON(fields[k]) {
			continue
		}
		return fmt.Errorf("%s%s is not supported by this server", where, k)
	}
	return nil
}

func isEmptyJSON(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "null", "{}", "[]", "false", `""`:
		return true
	}
	return false
}

// networkBody is E2B's SandboxNetworkConfig, as far as it is implemented.
type networkBody struct {
	AllowOut           *[]string       `json:"allowOut"`
	DenyOut            *[]string       `json:"denyOut"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	HTTPSPorts         []int           `json:"httpsPorts"`
	Rules              json.RawMessage `json:"rules"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
}

// The fields of E2B's network object that Airlock implements: egress
// rules, request rules, the egress proxy and ingress options.
var networkFields = []string{"allowOut", "denyOut", "allowPublicTraffic", "maskRequestHost", "httpsPorts", "rules", "egressProxy"}

// egressProxy reads E2B's network.egressProxy, strictly, and checks that
// its address is a public one: a name must resolve (by the host's
// resolver) to public addresses only. Where the daemon connects to it,
// the address it resolves to then is checked again.
func egressProxy(ctx context.Context, raw json.RawMessage) (*policy.EgressProxy, error) {
	if isEmptyJSON(raw) || len(raw) == 0 {
		return nil, nil
	}
	var ep policy.EgressProxy
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ep); err != nil {
		return nil, fmt.Errorf("network.egressProxy: %v", err)
	}
	if err := ep.Check(); err != nil {
		return nil, fmt.Errorf("network.%v", err)
	}
	host, _, _ := net.SplitHostPort(ep.Address)
	addrs := []netip.Addr{}
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = append(addrs, a)
	} else {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip4", host); err != nil || len(addrs) == 0 {
			return nil, fmt.Errorf("network.egressProxy.address: %q does not resolve", host)
		}
	}
	for _, a := range addrs {
		if policy.IsReserved(a) {
			return nil, fmt.Errorf("network.egressProxy.address: %s is a private or reserved address: the proxy must be on the internet", a)
		}
	}
	return &ep, nil
}

// ruleJSON is E2B's SandboxNetworkRule.
type ruleJSON struct {
	Transform *policy.Transform `json:"transform"`
}

// requestRules reads E2B's network.rules, strictly (a field of a rule
// this server does not implement is refused), and checks the secrets
// they name.
func (s *Server) requestRules(raw json.RawMessage) (map[string][]policy.Transform, error) {
	if isEmptyJSON(raw) || len(raw) == 0 {
		return nil, nil
	}
	var rules map[string][]ruleJSON
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rules); err != nil {
		return nil, fmt.Errorf("network.rules: %v", err)
	}
	return s.checkRules(rules)
}

// NetDefault is what the E2B API gives a sandbox that says nothing of its
// network, set by the daemon from its configuration (network.default).
type NetDefault struct {
	// Internet: E2B's rule. A create that says nothing gets the internet,
	// and a sealed one (allowInternetAccess false) an interface closed to
	// everything, which updateNetwork can open. False: such creates get
	// loopback only, no interface (a server without networks).
	Internet bool
	// SealedBy, if set, is the setting that seals the server: a request
	// for the internet is refused, naming it.
	SealedBy string
}

// SetNetworkDefault sets what creates that say nothing of the network get
// (the zero value, until set: loopback only).
func (s *Server) SetNetworkDefault(d NetDefault) { s.netDefault = d }

// egress turns E2B's allowInternetAccess and allowOut/denyOut into a
// policy, by E2B's rules: the internet unless allowInternetAccess is
// false (then only allowOut, as E2B's denyOut ALL_TRAFFIC over it);
// denyOut alone is the internet less what it denies. Airlock's own:
// allowOut alone (which E2B refuses for names and ignores for addresses)
// is only what it names. A request that says nothing gets the server's
// default (d), on a create and on an update alike (E2B's
// updateNetwork({}) clears every rule: the internet). On a sealed server
// a policy that opens the internet is refused.
func egress(d NetDefault, create bool, internet *bool, allowOut, denyOut *[]string) (policy.Network, error) {
	var n policy.Network
	var err error
	if allowOut != nil {
		if n.AllowOut, err = policy.ParseRules(*allowOut); err != nil {
			return n, fmt.Errorf("network.allowOut: %v", err)
		}
	}
	if denyOut != nil {
		if n.DenyOut, err = policy.ParseRules(*denyOut); err != nil {
			return n, fmt.Errorf("network.denyOut: %v", err)
		}
	}
	sealed := internet != nil && !*internet
	if sealed {
		n.DenyOut = nil // E2B's denyOut ALL_TRAFFIC replaces it
	}
	switch {
	case sealed && create && !d.Internet && allowOut == nil:
		// No interface where the server gives none by default.
	case sealed, internet == nil && allowOut != nil && denyOut == nil:
		n.Mode = policy.NetFiltered
	case internet != nil || denyOut != nil || d.Internet:
		n.Mode = policy.NetInternet
	case !create && d.SealedBy != "":
		n.Mode = policy.NetFiltered // a sealed server's default: closed
	}
	if d.SealedBy != "" && n.OpenInternet() {
		return n, fmt.Errorf("this server is sealed (%s): its sandboxes cannot reach the internet; create without allowInternetAccess or with it false (SDKs that send it true by default need it said), and name what a sandbox may reach in network.allowOut", d.SealedBy)
	}
	return n, nil
}

// ingress reads E2B's options for reaching the sandbox's own servers.
func (b *networkBody) ingress() (sandbox.Ingress, error) {
	in := sandbox.Ingress{Public: true}
	if b == nil {
		return in, nil
	}
	if b.AllowPublicTraffic != nil {
		in.Public = *b.AllowPublicTraffic
	}
	if b.MaskRequestHost != nil {
		in.MaskHost = *b.MaskRequestHost
		if strings.ContainsAny(in.MaskHost, " \t\r\n/") {
			return in, fmt.Errorf("network.maskRequestHost %q is not a host name", in.MaskHost)
		}
	}
	for _, p := range b.HTTPSPorts {
		if p < 1 || p > 65535 {
			return in, fmt.Errorf("network.httpsPorts: %d is not a port", p)
		}
		if fmt.Sprint(p) == agentproto.EnvdPort || fmt.Sprint(p) == agentproto.InterpreterPort {
			return in, fmt.Errorf("network.httpsPorts: port %d is the sandbox agent's", p)
		}
	}
	in.HTTPSPorts = b.HTTPSPorts
	return in, nil
}

// networkInfo is the network object of getInfo.
type networkInfo struct {
	Rules              map[string][]ruleJSON `json:"rules,omitempty"`
	EgressProxy        *egressProxyInfo      `json:"egressProxy,omitempty"`
	AllowOut           []string              `json:"allowOut,omitempty"`
	DenyOut            []string              `json:"denyOut,omitempty"`
	AllowPublicTraffic bool                  `json:"allowPublicTraffic"`
	MaskRequestHost    string                `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int                 `json:"httpsPorts,omitempty"`
}

func networkOf(sb *sandbox.Sandbox) (internet bool, info networkInfo) {
	n, _ := sb.Network()
	info = networkInfo{
		AllowOut: policy.Strings(n.AllowOut), DenyOut: policy.Strings(n.DenyOut),
		AllowPublicTraffic: sb.Ingress.Public, MaskRequestHost: sb.Ingress.MaskHost, HTTPSPorts: sb.Ingress.HTTPSPorts,
	}
	if ep := n.EgressProxy; ep != nil {
		info.EgressProxy = &egressProxyInfo{Address: ep.Address, Username: ep.Username} // never the password
	}
	if len(n.Rules) > 0 {
		info.Rules = map[string][]ruleJSON{}
		for host, ts := range n.Rules {
			for _, t := range ts {
				info.Rules[host] = append(info.Rules[host], ruleJSON{Transform: &t})
			}
		}
	}
	return n.Mode == policy.NetInternet, info
}

// egressProxyInfo is E2B's SandboxEgressProxyInfo.
type egressProxyInfo struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
}

// updateNetwork is PUT /sandboxes/{id}/network: the sandbox's egress
// policy replaced at once, every field omitted cleared.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := refuseUnknown(raw, []string{"allow_internet_access", "allowOut", "denyOut", "rules", "egressProxy"}, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var b struct {
		AllowInternetAccess *bool           `json:"allow_internet_access"`
		AllowOut            *[]string       `json:"allowOut"`
		DenyOut             *[]string       `json:"denyOut"`
		Rules               json.RawMessage `json:"rules"`
		EgressProxy         json.RawMessage `json:"egressProxy"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return
	}
	n, err := egress(s.netDefault, false, b.AllowInternetAccess, b.AllowOut, b.DenyOut)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if n.Rules, err = s.requestRules(b.Rules); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if n.EgressProxy, err = egressProxy(r.Context(), b.EgressProxy); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if n.Mode == policy.NetNone {
		n.Mode = policy.NetFiltered // the interface stays, closed
	}
	if err := s.m.UpdateNetwork(r.PathValue("id"), n); err != nil {
		s.managerError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readBody reads a JSON body of at most maxBody bytes; an empty one is {}.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBody)); err != nil {
		writeError(w, http.StatusBadRequest, "request body: %v", err)
		return nil, false
	}
	if len(bytes.TrimSpace(buf.Bytes())) == 0 {
		return []byte("{}"), true
	}
	return buf.Bytes(), true
}
