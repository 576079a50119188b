package process

import (
	"context"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	Pty   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process *selector     `json:"process"`
	Input   *processInput `json:"input"`
}

// SendInput writes to a process's stdin, or to its PTY.
func (s *Service) SendInput(ctx context.Context, r *http.Request, req *sendInputRequest) (*rpc.Empty, error) {
	p, err := s.find(req.Process)
	if err != nil {
		return nil, err
	}
	if req.Input == nil {
		return &rpc.Empty{}, nil
	}
	if p.pty != nil {
		if len(req.Input.Pty) == 0 && len(req.Input.Stdin) > 0 {
			return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "process %d has a PTY: send input to the pty", p.info.Pid)
		}
		if _, err := p.pty.Write(req.Input.Pty); err != nil {
			return nil, rpc.Errorf(agentproto.CodeInternal, "write to pty: %v", err)
		}
		return &rpc.Empty{}, nil
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "stdin of process %d is not open", p.info.Pid)
	}
	if _, err := p.stdin.Write(req.Input.Stdin); err != nil {
		return nil, rpc.Errorf(agentproto.CodeInternal, "write to stdin: %v", err)
	}
	return &rpc.Empty{}, nil
}

type closeStdinRequest struct {
	Process *selector `json:"process"`
}

// CloseStdin closes a process's stdin, which it reads as its end.
func (s *Service) CloseStdin(ctx context.Context, r *http.Request, req *closeStdinRequest) (*rpc.Empty, error) {
	p, err := s.find(req.Process)
	if err != nil {
		return nil, err
	}
	if p.pty != nil {
		return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "process %d has a PTY: send Ctrl-D (0x04) instead", p.info.Pid)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	return &rpc.Empty{}, nil
}

// StreamInput, envd's client stream of input, is not served: the SDKs
// send input with SendInput.
func (s *Service) StreamInput(ctx context.Context, r *http.Request, _ *rpc.Empty) (*rpc.Empty, error) {
	return nil, rpc.Errorf(agentproto.CodeUnimplemented, "StreamInput is not implemented; use SendInput")
}
