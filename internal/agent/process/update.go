package process

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/rpc"
	"github.com/airlock-sandbox/airlock/internal/agentproto"
)

type updateRequest struct {
	Process *selector       `json:"process"`
	Pty     *agentproto.PTY `json:"pty,omitempty"`
}

// Update resizes a process's PTY.
func (s *Service) Update(ctx context.Context, r *http.Request, req *updateRequest) (*rpc.Empty, error) {
	p, err := s.find(req.Process)
	if err != nil {
		return nil, err
	}
	if req.Pty != nil && req.Pty.Size != nil {
		if p.pty == nil {
			return nil, rpc.Errorf(agentproto.CodeFailedPrecondition, "process %d has no PTY", p.info.Pid)
		}
		if err := setPTYSize(p.pty, req.Pty.Size); err != nil {
			return nil, rpc.Errorf(agentproto.CodeInternal, "resize pty: %v", err)
		}
	}
	return &rpc.Empty{}, nil
}

// openPTY opens a new pseudo-terminal pair in the sandbox's devpts.
func openPTY(size *agentproto.PTYSize) (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlock: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	if size != nil {
		if err := setPTYSize(m, size); err != nil {
			m.Close()
			s.Close()
			return nil, nil, err
		}
	}
	return m, s, nil
}

func setPTYSize(f *os.File, size *agentproto.PTYSize) error {
	return unix.IoctlSetWinsize(int(f.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(size.Rows), Col: uint16(size.Cols)})
}
