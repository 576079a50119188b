package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// This file serves the Connect protocol's JSON flavour as agentproto
// describes it: unary calls and server streams.

// httpStatus is the HTTP status of a unary error, per the Connect spec.
var httpStatus = map[agentproto.Code]int{
	agentproto.CodeCanceled: 499, agentproto.CodeUnknown: 500, agentproto.CodeInvalidArgument: 400,
	agentproto.CodeDeadlineExceeded: 504, agentproto.CodeNotFound: 404, agentproto.CodeAlreadyExists: 409,
	agentproto.CodePermissionDenied: 403, agentproto.CodeResourceExhausted: 429, agentproto.CodeFailedPrecondition: 400,
	agentproto.CodeUnimplemented: 501, agentproto.CodeInternal: 500, agentproto.CodeUnavailable: 503,
}

func errorf(code agentproto.Code, format string, args ...any) *agentproto.Error {
	return &agentproto.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// asError turns any error into an *agentproto.Error; unknown ones become
// "internal".
func asError(err error) *agentproto.Error {
	var e *agentproto.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &agentproto.Error{Code: agentproto.CodeDeadlineExceeded, Message: err.Error()}
	}
	if errors.Is(err, context.Canceled) {
		return &agentproto.Error{Code: agentproto.CodeCanceled, Message: err.Error()}
	}
	return &agentproto.Error{Code: agentproto.CodeInternal, Message: err.Error()}
}

// maxMessage bounds one request message; the largest legitimate one is a
// SendInput chunk.
const maxMessage = 16 << 20

// requestContext applies the client's Connect-Timeout-Ms to ctx.
func requestContext(r *http.Request) (context.Context, context.CancelFunc, error) {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		ctx, cancel := context.WithCancel(r.Context())
		return ctx, cancel, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 {
		return nil, nil, errorf(agentproto.CodeInvalidArgument, "bad Connect-Timeout-Ms %q", v)
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(ms)*time.Millisecond)
	return ctx, cancel, nil
}

// unary serves a unary method with a JSON body.
func unary[Req, Resp any](fn func(ctx context.Context, r *http.Request, req *Req) (*Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		resp, err := callUnary(r, fn)
		if err != nil {
			e := asError(err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(httpStatus[e.Code])
			json.NewEncoder(w).Encode(e)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(resp)
	}
}

func callUnary[Req, Resp any](r *http.Request, fn func(context.Context, *http.Request, *Req) (*Resp, error)) (*Resp, error) {
	if r.Method != http.MethodPost {
		return nil, errorf(agentproto.CodeUnimplemented, "method %s not allowed", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return nil, errorf(agentproto.CodeUnimplemented, "content type %q is not supported: this server speaks the Connect JSON codec", ct)
	}
	ctx, cancel, err := requestContext(r)
	if err != nil {
		return nil, err
	}
	defer cancel()
	req := new(Req)
	body, err := io.ReadAll(io.LimitReader(r.Body, maxMessage+1))
	if err != nil {
		return nil, errorf(agentproto.CodeInvalidArgument, "read request: %v", err)
	}
	if len(body) > maxMessage {
		return nil, errorf(agentproto.CodeResourceExhausted, "request larger than %d bytes", maxMessage)
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, req); err != nil {
			return nil, errorf(agentproto.CodeInvalidArgument, "decode request: %v", err)
		}
	}
	return fn(ctx, r, req)
}

// stream is the sending side of a server stream.
type stream[Resp any] struct {
	w  *bufio.Writer
	fl http.Flusher
}

// Send writes one message and flushes it to the client at once.
func (s *stream[Resp]) Send(m *Resp) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return s.frame(0, data)
}

func (s *stream[Resp]) frame(flags byte, data []byte) error {
	agentproto.WriteEnvelope(s.w, flags, data) // an error sticks to s.w
	if err := s.w.Flush(); err != nil {
		return err
	}
	s.fl.Flush()
	return nil
}

// serverStream serves a server-streaming method. fn sends messages until it
// returns; its error, if any, travels in the end-of-stream frame.
func serverStream[Req, Resp any](fn func(ctx context.Context, r *http.Request, req *Req, s *stream[Resp]) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		fl, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "streaming unsupported", http.StatusInternalServerError)
			return
		}
		s := &stream[Resp]{w: bufio.NewWriter(w), fl: fl}
		err := callStream(r, fn, s)
		var end agentproto.EndStream
		if err != nil {
			end.Error = asError(err)
		}
		data, _ := json.Marshal(end)
		s.frame(agentproto.FlagEndStream, data)
	}
}

func callStream[Req, Resp any](r *http.Request, fn func(context.Context, *http.Request, *Req, *stream[Resp]) error, s *stream[Resp]) error {
	if r.Method != http.MethodPost {
		return errorf(agentproto.CodeUnimplemented, "method %s not allowed", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/connect+json") {
		return errorf(agentproto.CodeUnimplemented, "content type %q is not supported: this server speaks the Connect JSON codec", ct)
	}
	ctx, cancel, err := requestContext(r)
	if err != nil {
		return err
	}
	defer cancel()
	_, body, err := agentproto.ReadEnvelope(r.Body, maxMessage)
	switch {
	case err == agentproto.ErrCompressed:
		return errorf(agentproto.CodeUnimplemented, "compressed messages are not supported")
	case err == agentproto.ErrTooLarge:
		return errorf(agentproto.CodeResourceExhausted, "request larger than %d bytes", maxMessage)
	case err != nil:
		return errorf(agentproto.CodeInvalidArgument, "read request: %v", err)
	}
	// Read the request to its end before answering: a server stream has
	// one request message, and a request body still arriving while the
	// response streams makes Go's server close the connection afterwards,
	// under a proxy that is still sending (and then reading) on it.
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxMessage)); err != nil {
		return errorf(agentproto.CodeInvalidArgument, "read request: %v", err)
	}
	req := new(Req)
	if len(body) > 0 {
		if err := json.Unmarshal(body, req); err != nil {
			return errorf(agentproto.CodeInvalidArgument, "decode request: %v", err)
		}
	}
	return fn(ctx, r, req, s)
}

// keepaliveInterval is how often a stream with nothing to say sends a
// keepalive, from the SDK's Keepalive-Ping-Interval header (seconds).
func keepaliveInterval(r *http.Request) time.Duration {
	// At most a day: more seconds than that can overflow the Duration to
	// a negative one, on which the stream's ticker panics.
	if s, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && s > 0 {
		return time.Duration(min(s, 86400)) * time.Second
	}
	return 50 * time.Second
}
