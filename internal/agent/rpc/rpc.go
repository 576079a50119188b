// Package rpc serves the Connect protocol's JSON flavour, as agentproto
// describes it, to the agent's services: unary calls and server streams,
// errors as Connect errors.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Empty is the message of a call that has nothing to say.
type Empty struct{}

// statuses are the HTTP status of a unary error, per the Connect spec.
var statuses = map[agentproto.Code]int{
	agentproto.CodeCanceled: 499, agentproto.CodeUnknown: 500, agentproto.CodeInvalidArgument: 400,
	agentproto.CodeDeadlineExceeded: 504, agentproto.CodeNotFound: 404, agentproto.CodeAlreadyExists: 409,
	agentproto.CodePermissionDenied: 403, agentproto.CodeResourceExhausted: 429, agentproto.CodeFailedPrecondition: 400,
	agentproto.CodeUnauthenticated: 401, agentproto.CodeUnimplemented: 501, agentproto.CodeInternal: 500, agentproto.CodeUnavailable: 503,
}

// Status is the HTTP status of a unary call that failed with code; 0 for
// a code Connect does not know.
func Status(code agentproto.Code) int { return statuses[code] }

// Errorf is an error the client sees, with its Connect code.
func Errorf(code agentproto.Code, format string, args ...any) *agentproto.Error {
	return &agentproto.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// AsError turns any error into an *agentproto.Error; unknown ones become
// "internal".
func AsError(err error) *agentproto.Error {
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

// MaxMessage bounds one request message; the largest legitimate one is a
// SendInput chunk.
const MaxMessage = 16 << 20

// requestContext applies the client's Connect-Timeout-Ms to ctx.
func requestContext(r *http.Request) (context.Context, context.CancelFunc, error) {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		ctx, cancel := context.WithCancel(r.Context())
		return ctx, cancel, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 {
		return nil, nil, Errorf(agentproto.CodeInvalidArgument, "bad Connect-Timeout-Ms %q", v)
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(ms)*time.Millisecond)
	return ctx, cancel, nil
}

// KeepaliveInterval is how often a stream with nothing to say sends a
// keepalive, from the SDK's Keepalive-Ping-Interval header (seconds).
func KeepaliveInterval(r *http.Request) time.Duration {
	// At most a day: more seconds than that can overflow the Duration to
	// a negative one, on which the stream's ticker panics.
	if s, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && s > 0 {
		return time.Duration(min(s, 86400)) * time.Second
	}
	return 50 * time.Second
}
