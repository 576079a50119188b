package jupyter

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// TestSign: HMAC-SHA256 of the header, parent header, metadata and
// content, in that order, hex-encoded, as the messaging spec has it.
func TestSign(t *testing.T) {
	k := &Kernel{key: []byte("key")}
	mac := hmac.New(sha256.New, []byte("key"))
	for _, p := range []string{"h", "p", "m", "c"} {
		mac.Write([]byte(p))
	}
	if got, want := k.sign([]byte("h"), []byte("p"), []byte("m"), []byte("c")), hex.EncodeToString(mac.Sum(nil)); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if k.sign([]byte("hp"), nil, []byte("m"), []byte("c")) != k.sign([]byte("h"), []byte("p"), []byte("m"), []byte("c")) {
		t.Error("the parts are joined end to end")
	}
}

func TestDecode(t *testing.T) {
	k := &Kernel{key: []byte("key")}
	signed := func(ids []string, hdr, parent, meta, content string) [][]byte {
		var f [][]byte
		for _, id := range ids {
			f = append(f, []byte(id))
		}
		sig := k.sign([]byte(hdr), []byte(parent), []byte(meta), []byte(content))
		return append(f, []byte(delimiter), []byte(sig), []byte(hdr), []byte(parent), []byte(meta), []byte(content))
	}
	good := signed(nil, `{"msg_id":"1","msg_type":"stream"}`, `{"msg_id":"0"}`, `{}`, `{"text":"x"}`)
	m, err := k.decode(good)
	if err != nil || m.Header.MsgID != "1" || m.Header.MsgType != "stream" || m.Parent.MsgID != "0" || string(m.Content) != `{"text":"x"}` {
		t.Fatalf("got %+v, %v", m, err)
	}
	if m, err := k.decode(signed([]string{"router-id", "another"}, `{"msg_type":"a"}`, `{}`, `{}`, `{}`)); err != nil || m.Header.MsgType != "a" {
		t.Errorf("with identities before the delimiter: %+v, %v", m, err)
	}
	if m, err := k.decode(signed(nil, `{"msg_type":"a"}`, `not json`, `{}`, `{}`)); err != nil || m.Parent != (Header{}) {
		t.Errorf("a parent header that is no JSON is none: %+v, %v", m, err)
	}
	forged := signed(nil, `{"msg_type":"a"}`, `{}`, `{}`, `{}`)
	forged[5] = []byte(`{"evil":1}`)
	for name, frames := range map[string][][]byte{
		"no delimiter":       {[]byte("a"), []byte("b"), []byte("c"), []byte("d"), []byte("e"), []byte("f")},
		"short":              good[:5],
		"content changed":    forged,
		"signed another way": signed(nil, `{}`, `{}`, `{}`, `{}`)[:1],
		"a bad header":       signed(nil, `not json`, `{}`, `{}`, `{}`),
	} {
		if m, err := k.decode(frames); err == nil {
			t.Errorf("%s: taken as %+v", name, m)
		}
	}
	other := &Kernel{key: []byte("another key")}
	if _, err := other.decode(good); err == nil || !strings.Contains(err.Error(), "signature") {
		t.Errorf("another kernel's key: %v, want a bad signature", err)
	}
}
