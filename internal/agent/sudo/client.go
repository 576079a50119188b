package sudo

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/identity"
)

// dial connects to the agent's sudo socket, and makes sure it is the
// agent's.
func dial() (*net.UnixConn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, errors.New(`this sandbox has no root: its template runs everything as "user" (templates made from images have root and sudo)`)
	}
	// The name is the agent's only while it serves: whoever else holds it
	// must not be handed this command's stdio and environment.
	if uid, err := peerUID(c); err != nil || uid != identity.Root.UID {
		c.Close()
		return nil, errors.New("the sudo socket is not the agent's")
	}
	return c, nil
}

// run has the agent at the other end of c run req with stdio (the
// descriptors of stdin, stdout and stderr), relays the signals sigs
// carries, and returns the command's exit status.
func run(c *net.UnixConn, req *request, stdio []int, sigs <-chan os.Signal) (int, error) {
	if err := send(c, req, stdio); err != nil {
		return 0, err
	}
	return await(c, sigs)
}

// send sends req, with stdio (a closed descriptor as /dev/null).
func send(c *net.UnixConn, req *request, stdio []int) error {
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	fds := append([]int(nil), stdio...)
	for i, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil { // closed: the command gets /dev/null
			null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(null)
			fds[i] = null
		}
	}
	// The descriptors go with the first bytes; the rest of a long request
	// follows.
	line = append(line, '\n')
	n, _, err := c.WriteMsgUnix(line[:min(len(line), 4096)], unix.UnixRights(fds...), nil)
	if err == nil && n < len(line) {
		_, err = c.Write(line[n:])
	}
	return err
}

// await relays the signals sigs carries until the agent says how the
// command ended.
func await(c *net.UnixConn, sigs <-chan os.Signal) (int, error) {
	enc := json.NewEncoder(c)
	go func() {
		for s := range sigs {
			enc.Encode(message{Signal: int(s.(syscall.Signal))})
		}
	}()
	var m message
	if err := json.NewDecoder(c).Decode(&m); err != nil {
		return 0, fmt.Errorf("the agent went away: %v", err)
	}
	if m.Error != "" {
		return 0, errors.New(m.Error)
	}
	if m.Exit == nil {
		return 0, errors.New("the agent said nothing of the command's end")
	}
	return *m.Exit, nil
}
