// Package apikey says whether an API key is strong enough to guard a
// server, and names a key in logs without revealing it.
package apikey

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// MinLength is the shortest key accepted: 32 characters, which as hex
// digits carry 128 random bits, the least a key that is checked online
// and never rotated should have. A generated key ("e2b_" and 40 hex
// digits, 160 bits) is longer.
const MinLength = 32

// minDistinct is how many different characters a key must have: a long
// key of one or two repeated characters ("aaaa…", "0000…") is a
// placeholder, not a secret.
const minDistinct = 8

// Check refuses a key that is too weak to guard the server, with one
// line that says what a key needs; name says where the key came from.
func Check(name, key string) error {
	seen := map[rune]bool{}
	for _, c := range key {
		seen[c] = true
	}
	if len(key) < MinLength || len(seen) < minDistinct {
		return fmt.Errorf("%s is too weak: an API key needs at least %d characters, %d of them different (128 random bits, e.g. e2b_$(openssl rand -hex 20)); or unset it to have one generated",
			name, MinLength, minDistinct)
	}
	return nil
}

// Fingerprint names key in logs and on a terminal without revealing it:
// the first 8 hex digits of its sha256, as "sha256:1a2b3c4d". That is 32
// bits of a hash of 128 or more: enough to tell keys apart, far too
// little to find one from.
func Fingerprint(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:4])
}
