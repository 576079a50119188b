package rpc

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Stream is the sending side of a server stream.
type Stream[Resp any] struct {
	w  *bufio.Writer
	fl http.Flusher
}

// Send writes one message and flushes it to the client at once.
func (s *Stream[Resp]) Send(m *Resp) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return s.frame(0, data)
}

func (s *Stream[Resp]) frame(flags byte, data []byte) error {
	agentproto.WriteEnvelope(s.w, flags, data) // an error sticks to s.w
	if err := s.w.Flush(); err != nil {
		return err
	}
	s.fl.Flush()
	return nil
}

// ServerStream serves a server-streaming method. fn sends messages until
// it returns; its error, if any, travels in the end-of-stream frame.
func ServerStream[Req, Resp any](fn func(ctx context.Context, r *http.Request, req *Req, s *Stream[Resp]) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		fl, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "streaming unsupported", http.StatusInternalServerError)
			return
		}
		s := &Stream[Resp]{w: bufio.NewWriter(w), fl: fl}
		err := callStream(r, fn, s)
		var end agentproto.EndStream
		if err != nil {
			end.Error = AsError(err)
		}
		data, _ := json.Marshal(end)
		s.frame(agentproto.FlagEndStream, data)
	}
}

func callStream[Req, Resp any](r *http.Request, fn func(context.Context, *http.Request, *Req, *Stream[Resp]) error, s *Stream[Resp]) error {
	if r.Method != http.MethodPost {
		return Errorf(agentproto.CodeUnimplemented, "method %s not allowed", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/connect+json") {
		return Errorf(agentproto.CodeUnimplemented, "content type %q is not supported: this server speaks the Connect JSON codec", ct)
	}
	ctx, cancel, err := requestContext(r)
	if err != nil {
		return err
	}
	defer cancel()
	_, body, err := agentproto.ReadEnvelope(r.Body, MaxMessage)
	switch {
	case err == agentproto.ErrCompressed:
		return Errorf(agentproto.CodeUnimplemented, "compressed messages are not supported")
	case err == agentproto.ErrTooLarge:
		return Errorf(agentproto.CodeResourceExhausted, "request larger than %d bytes", MaxMessage)
	case err != nil:
		return Errorf(agentproto.CodeInvalidArgument, "read request: %v", err)
	}
	// Read the request to its end before answering: a server stream has
	// one request message, and a request body still arriving while the
	// response streams makes Go's server close the connection afterwards,
	// under a proxy that is still sending (and then reading) on it.
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, MaxMessage)); err != nil {
		return Errorf(agentproto.CodeInvalidArgument, "read request: %v", err)
	}
	req := new(Req)
	if len(body) > 0 {
		if err := json.Unmarshal(body, req); err != nil {
			return Errorf(agentproto.CodeInvalidArgument, "decode request: %v", err)
		}
	}
	return fn(ctx, r, req, s)
}
