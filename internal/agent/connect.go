package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// This file serves the Connect protocol's JSON flavour, the subset the E2B
// SDKs speak: unary calls (a JSON POST answered with JSON) and server
// streams (5-byte-framed JSON messages, closed by an end-of-stream frame).
// It is hand-written rather than generated with connect-go: the agent is
// the same binary as the sandbox's init, started for every sandbox, and
// protobuf-go's registry would add to every start (a comparable registry
// measured 0.8 ms) for a wire format this small.

// Code is a Connect error code.
type Code string

const (
	CodeCanceled           Code = "canceled"
	CodeUnknown            Code = "unknown"
	CodeInvalidArgument    Code = "invalid_argument"
	CodeDeadlineExceeded   Code = "deadline_exceeded"
	CodeNotFound           Code = "not_found"
	CodeAlreadyExists      Code = "already_exists"
	CodePermissionDenied   Code = "permission_denied"
	CodeResourceExhausted  Code = "resource_exhausted"
	CodeFailedPrecondition Code = "failed_precondition"
	CodeUnimplemented      Code = "unimplemented"
	CodeInternal           Code = "internal"
	CodeUnavailable        Code = "unavailable"
)

// httpStatus is the HTTP status of a unary error, per the Connect spec.
var httpStatus = map[Code]int{
	CodeCanceled: 499, CodeUnknown: 500, CodeInvalidArgument: 400, CodeDeadlineExceeded: 504,
	CodeNotFound: 404, CodeAlreadyExists: 409, CodePermissionDenied: 403, CodeResourceExhausted: 429,
	CodeFailedPrecondition: 400, CodeUnimplemented: 501, CodeInternal: 500, CodeUnavailable: 503,
}

// Error is an RPC error with its Connect code. Its message reaches the
// client, so it must not carry anything of the host (the agent sees only
// the sandbox, which keeps that true by construction).
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message,omitempty"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

func errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// asError turns any error into an *Error; unknown ones become "internal".
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: CodeDeadlineExceeded, Message: err.Error()}
	}
	if errors.Is(err, context.Canceled) {
		return &Error{Code: CodeCanceled, Message: err.Error()}
	}
	return &Error{Code: CodeInternal, Message: err.Error()}
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
		return nil, nil, errorf(CodeInvalidArgument, "bad Connect-Timeout-Ms %q", v)
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
		return nil, errorf(CodeUnimplemented, "method %s not allowed", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return nil, errorf(CodeUnimplemented, "content type %q is not supported: this server speaks the Connect JSON codec", ct)
	}
	ctx, cancel, err := requestContext(r)
	if err != nil {
		return nil, err
	}
	defer cancel()
	req := new(Req)
	body, err := io.ReadAll(io.LimitReader(r.Body, maxMessage+1))
	if err != nil {
		return nil, errorf(CodeInvalidArgument, "read request: %v", err)
	}
	if len(body) > maxMessage {
		return nil, errorf(CodeResourceExhausted, "request larger than %d bytes", maxMessage)
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, req); err != nil {
			return nil, errorf(CodeInvalidArgument, "decode request: %v", err)
		}
	}
	return fn(ctx, r, req)
}

// Frame flags of the Connect streaming envelope.
const (
	flagCompressed = 0x01
	flagEndStream  = 0x02
)

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
	var hdr [5]byte
	hdr[0] = flags
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(data)))
	s.w.Write(hdr[:])
	s.w.Write(data)
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
		end := struct {
			Error *Error `json:"error,omitempty"`
		}{}
		if err != nil {
			end.Error = asError(err)
		}
		data, _ := json.Marshal(end)
		s.frame(flagEndStream, data)
	}
}

func callStream[Req, Resp any](r *http.Request, fn func(context.Context, *http.Request, *Req, *stream[Resp]) error, s *stream[Resp]) error {
	if r.Method != http.MethodPost {
		return errorf(CodeUnimplemented, "method %s not allowed", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/connect+json") {
		return errorf(CodeUnimplemented, "content type %q is not supported: this server speaks the Connect JSON codec", ct)
	}
	ctx, cancel, err := requestContext(r)
	if err != nil {
		return err
	}
	defer cancel()
	var hdr [5]byte
	if _, err := io.ReadFull(r.Body, hdr[:]); err != nil {
		return errorf(CodeInvalidArgument, "read request frame: %v", err)
	}
	if hdr[0]&flagCompressed != 0 {
		return errorf(CodeUnimplemented, "compressed messages are not supported")
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxMessage {
		return errorf(CodeResourceExhausted, "request larger than %d bytes", maxMessage)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r.Body, body); err != nil {
		return errorf(CodeInvalidArgument, "read request: %v", err)
	}
	// Read the request to its end before answering: a server stream has
	// one request message, and a request body still arriving while the
	// response streams makes Go's server close the connection afterwards,
	// under a proxy that is still sending (and then reading) on it.
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxMessage)); err != nil {
		return errorf(CodeInvalidArgument, "read request: %v", err)
	}
	req := new(Req)
	if n > 0 {
		if err := json.Unmarshal(body, req); err != nil {
			return errorf(CodeInvalidArgument, "decode request: %v", err)
		}
	}
	return fn(ctx, r, req, s)
}

// keepaliveInterval is how often a stream with nothing to say sends a
// keepalive, from the SDK's Keepalive-Ping-Interval header (seconds).
func keepaliveInterval(r *http.Request) time.Duration {
	if s, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 50 * time.Second
}
