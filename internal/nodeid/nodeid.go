// Package nodeid ties sandbox ids to the nodes of a cluster: the first
// six hex digits after a sandbox id's "i" are its node's prefix, so that
// a router finds the node of any request from the id alone. A leaf: the
// daemon uses it without Kubernetes' packages.
package nodeid

import (
	"crypto/sha256"
	"encoding/hex"
)

// Prefix is what the ids of node's sandboxes begin with after their "i":
// six hex digits of the name's SHA-256.
func Prefix(node string) string {
	sum := sha256.Sum256([]byte(node))
	return hex.EncodeToString(sum[:3])
}

// Of is the node prefix of sandbox id, "" if id is no sandbox id.
func Of(id string) string {
	if len(id) != 20 || id[0] != 'i' {
		return ""
	}
	p := id[1:7]
	if _, err := hex.DecodeString(p); err != nil {
		return ""
	}
	return p
}
