package sudo

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// maxRequest bounds a request (argv and environment: the kernel's own
// limit for them is about as large).
const maxRequest = 4 << 20

// readRequest reads the request, one JSON line whose first bytes carry
// sudo's stdin, stdout and stderr, and returns what follows it. The
// descriptors it returns, even with an error, are the caller's to close.
func readRequest(c *net.UnixConn) (*request, []*os.File, io.Reader, error) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, nil, err
	}
	var stdio []*os.File
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, nil, nil, err
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd) // no other command may inherit them
			stdio = append(stdio, os.NewFile(uintptr(fd), "sudo stdio"))
		}
	}
	if len(stdio) != 3 {
		return nil, stdio, nil, fmt.Errorf("expected stdin, stdout and stderr, got %d descriptors", len(stdio))
	}
	r := bufio.NewReader(io.MultiReader(bytes.NewReader(buf[:n]), c))
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if line = append(line, chunk...); len(line) > maxRequest {
			return nil, stdio, nil, fmt.Errorf("the request is larger than %d bytes", maxRequest)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, stdio, nil, fmt.Errorf("reading the request: %v", err)
		}
		break
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return nil, stdio, nil, fmt.Errorf("bad request: %v", err)
	}
	return &req, stdio, r, nil
}
