// Package sandboxid reads what a sandbox's id and host name carry: in a
// cluster, the first six hex digits after an id's "i" are its node's
// prefix, so that a router finds the node of any request from the id
// alone; and a host {port}-{id}.{domain} names a sandbox's port. Routers
// and nodes read both with these same functions, so that they never
// disagree on what a request is. A leaf: the daemon uses it without
// Kubernetes' packages.
package sandboxid

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"strings"
)

// NodePrefix is what the ids of node's sandboxes begin with after their
// "i": six hex digits of the name's SHA-256.
func NodePrefix(node string) string {
	sum := sha256.Sum256([]byte(node))
	return hex.EncodeToString(sum[:3])
}

// An id is E2B-like: "i" and 19 lower-case hex digits, the first of
// them, in a cluster, its node's prefix. New makes them, Valid reads
// them: the one place the format is written.
const idDigits = 19

// New returns a new random sandbox id beginning with prefix (hex
// digits, at most 19; "" outside a cluster).
func New(prefix string) string {
	var b [10]byte
	rand.Read(b[:])
	return "i" + prefix + hex.EncodeToString(b[:])[:idDigits-len(prefix)]
}

// Valid reports whether id has the form of a sandbox id.
func Valid(id string) bool {
	if len(id) != 1+idDigits || id[0] != 'i' {
		return false
	}
	for _, c := range id[1:] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// NodeOf is the node prefix of sandbox id, "" if id is no sandbox id. It
// reads only the id's length, "i" and prefix, of either case: a router
// passes on what it cannot place to a node, which knows its ids.
func NodeOf(id string) string {
	if len(id) != 1+idDigits || id[0] != 'i' {
		return ""
	}
	p := id[1:7]
	if _, err := hex.DecodeString(p); err != nil {
		return ""
	}
	return p
}

// ParseHost reads a host of the form {port}-{sandboxID}.{domain}, as the
// SDKs' getHost builds it: case aside, and whatever the domain's port,
// if any (a proxy in front may listen elsewhere).
func ParseHost(host, domain string) (port, id string, ok bool) {
	label, rest, found := strings.Cut(strings.ToLower(host), ".")
	if !found || domain == "" {
		return "", "", false
	}
	if h, _, err := net.SplitHostPort(rest); err == nil {
		rest = h
	}
	domain = strings.ToLower(domain)
	if h, _, err := net.SplitHostPort(domain); err == nil {
		domain = h
	}
	if rest != domain {
		return "", "", false
	}
	port, id, found = strings.Cut(label, "-")
	if !found || port == "" || id == "" || strings.Trim(port, "0123456789") != "" {
		return "", "", false
	}
	return port, id, true
}
