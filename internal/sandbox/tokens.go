package sandbox

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
)

// A sandbox's tokens are MACs of its id under the manager's key rather
// than random strings kept with it, so that a token can be checked for a
// sandbox that no longer exists: the gateway tells a client holding a
// gone sandbox's token that it is gone (502, what the SDKs read as "not
// running"), and everyone else only that their token is wrong (401), so
// that ids cannot be probed for existence. Sandboxes restored from disk
// keep the tokens their records hold.

// Token kinds: the envd port's access token and the traffic token of the
// sandbox's other ports.
const (
	accessToken  = "access"
	trafficToken = "traffic"
)

func newTokenKey() []byte {
	key := make([]byte, 32)
	rand.Read(key)
	return key
}

// token is id's token of kind: 192 bits of HMAC-SHA256, in hex.
func (m *Manager) token(kind, id string) string {
	mac := hmac.New(sha256.New, m.cfg.TokenKey)
	mac.Write([]byte(kind + "\x00" + id))
	return hex.EncodeToString(mac.Sum(nil)[:24])
}

// Issued reports whether this manager issued token to sandbox id, as its
// access token or, with traffic, its traffic token — whether or not the
// sandbox still exists.
func (m *Manager) Issued(id, token string, traffic bool) bool {
	kind := accessToken
	if traffic {
		kind = trafficToken
	}
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(m.token(kind, id))) == 1
}
