package rpc

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

// Unary serves a unary method with a JSON body.
func Unary[Req, Resp any](fn func(ctx context.Context, r *http.Request, req *Req) (*Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		resp, err := callUnary(r, fn)
		if err != nil {
			e := AsError(err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(statuses[e.Code])
			json.NewEncoder(w).Encode(e)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(resp)
	}
}

func callUnary[Req, Resp any](r *http.Request, fn func(context.Context, *http.Request, *Req) (*Resp, error)) (*Resp, error) {
	if r.Method != http.MethodPost {
		return nil, Errorf(agentproto.CodeUnimplemented, "method %s not allowed", r.Method)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return nil, Errorf(agentproto.CodeUnimplemented, "content type %q is not supported: this server speaks the Connect JSON codec", ct)
	}
	ctx, cancel, err := requestContext(r)
	if err != nil {
		return nil, err
	}
	defer cancel()
	req := new(Req)
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxMessage+1))
	if err != nil {
		return nil, Errorf(agentproto.CodeInvalidArgument, "read request: %v", err)
	}
	if len(body) > MaxMessage {
		return nil, Errorf(agentproto.CodeResourceExhausted, "request larger than %d bytes", MaxMessage)
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, req); err != nil {
			return nil, Errorf(agentproto.CodeInvalidArgument, "decode request: %v", err)
		}
	}
	return fn(ctx, r, req)
}
