package jupyter

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Message is one Jupyter message.
type Message struct {
	Header   Header          `json:"header"`
	Parent   Header          `json:"parent_header"`
	Metadata json.RawMessage `json:"metadata"`
	Content  json.RawMessage `json:"content"`
}

// Header is a message header.
type Header struct {
	MsgID    string `json:"msg_id,omitempty"`
	Session  string `json:"session,omitempty"`
	Username string `json:"username,omitempty"`
	Date     string `json:"date,omitempty"`
	MsgType  string `json:"msg_type,omitempty"`
	Version  string `json:"version,omitempty"`
}

const delimiter = "<IDS|MSG>"

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recvLoop feeds one socket's messages to ch (Recv blocks without a
// timeout, so it gets a goroutine of its own).
func (k *Kernel) recvLoop(s zmq4.Socket, ch chan *Message) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return
		}
		m, err := k.decode(raw.Frames)
		if err != nil {
			continue
		}
		select {
		case ch <- m:
		case <-k.done:
			return
		}
	}
}

func (k *Kernel) sign(parts ...[]byte) string {
	mac := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		mac.Write(p)
	}
	return hex.EncodeToString(mac.Sum(nil))
}

func (k *Kernel) decode(frames [][]byte) (*Message, error) {
	i := 0
	for i < len(frames) && string(frames[i]) != delimiter {
		i++
	}
	if len(frames) < i+6 {
		return nil, errors.New("short message")
	}
	f := frames[i+1:]
	if !hmac.Equal([]byte(k.sign(f[1], f[2], f[3], f[4])), f[0]) {
		return nil, errors.New("bad signature")
	}
	m := &Message{Metadata: f[3], Content: f[4]}
	if err := json.Unmarshal(f[1], &m.Header); err != nil {
		return nil, err
	}
	_ = json.Unmarshal(f[2], &m.Parent)
	return m, nil
}

// send sends a request on s and returns its msg_id.
func (k *Kernel) send(s zmq4.Socket, msgType string, content any) (string, error) {
	h := Header{
		MsgID: newID(), Session: k.session, Username: "user", MsgType: msgType, Version: "5.3",
		Date: time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
	}
	hdr, _ := json.Marshal(h)
	body, err := json.Marshal(content)
	if err != nil {
		return "", err
	}
	parent, meta := []byte("{}"), []byte("{}")
	msg := zmq4.NewMsgFrom([]byte(delimiter), []byte(k.sign(hdr, parent, meta, body)), hdr, parent, meta, body)
	if err := s.Send(msg); err != nil {
		return "", fmt.Errorf("send to kernel: %w", err)
	}
	return h.MsgID, nil
}
