package rpc

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

func TestAsError(t *testing.T) {
	own := Errorf(agentproto.CodeNotFound, "process with pid %d not found", 7)
	for _, tc := range []struct {
		name string
		err  error
		want agentproto.Error
	}{
		{"a Connect error", own, *own},
		{"wrapped", fmt.Errorf("start: %w", own), *own},
		{"a deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), agentproto.Error{Code: agentproto.CodeDeadlineExceeded, Message: "wait: context deadline exceeded"}},
		{"cancelled", context.Canceled, agentproto.Error{Code: agentproto.CodeCanceled, Message: "context canceled"}},
		{"anything else", errors.New("boom"), agentproto.Error{Code: agentproto.CodeInternal, Message: "boom"}},
	} {
		if got := AsError(tc.err); *got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, *got, tc.want)
		}
	}
}

func TestStatus(t *testing.T) {
	for code, want := range map[agentproto.Code]int{
		agentproto.CodeNotFound: 404, agentproto.CodeInvalidArgument: 400, agentproto.CodePermissionDenied: 403,
		agentproto.CodeCanceled: 499, agentproto.CodeUnimplemented: 501, "no such code": 0,
	} {
		if got := Status(code); got != want {
			t.Errorf("Status(%s) = %d, want %d", code, got, want)
		}
	}
}

func TestKeepaliveInterval(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"": 50 * time.Second, "1": time.Second, "30": 30 * time.Second, "0": 50 * time.Second, "-3": 50 * time.Second,
		"x": 50 * time.Second, "86400": 24 * time.Hour, "9227000000": 24 * time.Hour,
	} {
		r := httptest.NewRequest("POST", "/", nil)
		if v != "" {
			r.Header.Set("Keepalive-Ping-Interval", v)
		}
		if got := KeepaliveInterval(r); got != want {
			t.Errorf("Keepalive-Ping-Interval %q: got %v, want %v", v, got, want)
		}
	}
}
