package jupyter

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzDecode: a kernel's message (frames of the sandbox's code, split
// here at 0xff bytes) never panics; it is taken only when signed with
// the kernel's key, and then as it was sent: its header, metadata and
// content those of the frames after the delimiter.
func FuzzDecode(f *testing.F) {
	join := func(frames ...string) []byte { return []byte(strings.Join(frames, "\xff")) }
	f.Add(join("id", delimiter, "sig", `{"msg_id":"1","msg_type":"stream"}`, `{}`, `{}`, `{"name":"stdout","text":"hi"}`), true)
	f.Add(join(delimiter, "sig", `{"msg_type":"status"}`, `{"msg_id":"0"}`, `{}`, `{"execution_state":"idle"}`), true)
	f.Add(join(delimiter, "sig", `{"msg_type":"status"}`, `{}`, `{}`, `{}`), false)
	f.Add(join(delimiter, "sig", `not json`, `not json`, `{}`, `{}`), true)
	f.Add(join(delimiter, "sig", `{}`, `{}`, `{}`), true)
	f.Add(join("a", "b", "c", "d", "e", "f", "g"), true)
	f.Add(join(delimiter, delimiter, delimiter, delimiter, delimiter, delimiter), true)
	f.Add(join(delimiter, "", "", "", "", ""), false)
	f.Add([]byte{}, false)
	k := &Kernel{key: []byte("the kernel's key")}
	f.Fuzz(func(t *testing.T, raw []byte, sign bool) {
		frames := bytes.Split(raw, []byte{0xff})
		i := 0
		for i < len(frames) && string(frames[i]) != delimiter {
			i++
		}
		whole := len(frames) >= i+6
		if whole && sign {
			rest := frames[i+1:]
			rest[0] = []byte(k.sign(rest[1], rest[2], rest[3], rest[4]))
		}
		m, err := k.decode(frames)
		if err != nil {
			if whole && sign && json.Unmarshal(frames[i+2], &Header{}) == nil {
				t.Errorf("a signed message was refused: %v", err)
			}
			return
		}
		if !whole {
			t.Fatalf("%q was taken as a message, with no five frames after a delimiter", raw)
		}
		rest := frames[i+1:]
		if string(rest[0]) != k.sign(rest[1], rest[2], rest[3], rest[4]) {
			t.Fatalf("a message of a signature %q not the key's was taken", rest[0])
		}
		var h Header
		json.Unmarshal(rest[1], &h)
		if m.Header != h || !bytes.Equal(m.Metadata, rest[3]) || !bytes.Equal(m.Content, rest[4]) {
			t.Errorf("frames %q were taken as %+v", rest, m)
		}
	})
}
