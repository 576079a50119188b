package agentproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxResponse bounds what a Client reads of one response, a stream's
// messages together. The agent runs inside the sandbox and is as
// untrusted as the code there: an answer must not be able to exhaust the
// daemon's memory.
const MaxResponse = 32 << 20

// Client calls one sandbox's agent: the daemon's side of the protocol,
// the same requests the E2B SDKs make.
//
// Every call expects 200 OK; any other status is the agent's (or a
// gateway's) refusal, returned as an *Error whose message describes the
// sandbox, not the host. Any other error is the caller's own (a dial
// error can name a socket path).
type Client struct {
	// Transport carries every request: a sandbox's, which dials its
	// agent, or one to a gateway.
	Transport http.RoundTripper
	// URL is the origin requests go to: a gateway's, or "" for the agent
	// itself.
	URL string
	// Header is sent with every request: a gateway's E2b-Sandbox-Id and
	// X-Access-Token.
	Header http.Header
}

// Do sends a request to port (EnvdPort or InterpreterPort) and returns
// the response. Its body fails with ErrTooLarge past MaxResponse rather
// than end early, so a cut-off answer is never mistaken for a whole one.
func (c *Client) Do(ctx context.Context, port, method, path, contentType string, body io.Reader) (*http.Response, error) {
	return c.do(ctx, port, method, path, contentType, nil, body)
}

func (c *Client) do(ctx context.Context, port, method, path, contentType string, hdr http.Header, body io.Reader) (*http.Response, error) {
	resp, err := c.send(ctx, port, method, path, contentType, hdr, body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, failure(resp)
	}
	resp.Body = &limitedBody{r: io.LimitReader(resp.Body, MaxResponse+1), c: resp.Body}
	return resp, nil
}

// send sends a request and returns the response whatever its status.
func (c *Client) send(ctx context.Context, port, method, path, contentType string, hdr http.Header, body io.Reader) (*http.Response, error) {
	base := c.URL
	if base == "" {
		base = "http://agent"
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return nil, err
	}
	maps.Copy(req.Header, c.Header)
	maps.Copy(req.Header, hdr)
	req.Header.Set("E2b-Sandbox-Port", port)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return c.Transport.RoundTrip(req)
}

// failure reads the error an agent answered with: a Connect error, envd's
// and the interpreter's {code: status, message}, or plain text.
func failure(resp *http.Response) *Error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var body struct {
		Code    any    `json:"code"`
		Message string `json:"message"`
	}
	e := &Error{Code: CodeUnknown}
	if json.Unmarshal(data, &body) == nil && body.Message != "" {
		e.Message = body.Message
		if code, ok := body.Code.(string); ok {
			e.Code = Code(code)
		}
	} else {
		e.Message = strings.TrimSpace(string(data))
	}
	if e.Message == "" {
		e.Message = resp.Status
	}
	return e
}

// limitedBody fails a read past MaxResponse instead of truncating
// silently.
type limitedBody struct {
	r io.Reader // limited to MaxResponse+1
	c io.Closer
	n int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.n += int64(n); b.n > MaxResponse {
		return 0, ErrTooLarge
	}
	return n, err
}

func (b *limitedBody) Close() error { return b.c.Close() }

// Call makes a unary Connect call of procedure on the envd port: req goes
// as JSON, and the answer is decoded into resp.
func (c *Client) Call(ctx context.Context, procedure string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := c.Do(ctx, EnvdPort, http.MethodPost, procedure, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer r.Body.Close()
	return json.NewDecoder(r.Body).Decode(resp)
}

// Stream makes a server-streaming Connect call of procedure on the envd
// port and yields its messages until the stream's end. An error ends the
// iteration: the *Error the stream ended with, ErrTooLarge, or a broken
// stream. Leaving the loop early closes the stream.
//
// ctx bounds this side's wait. timeout, if positive, goes to the agent
// as Connect-Timeout-Ms: the agent ends the call then, and Start kills
// its process; without one, a process outlives the call (E2B's semantics).
func Stream[Resp any](ctx context.Context, c *Client, procedure string, req any, timeout time.Duration) iter.Seq2[*Resp, error] {
	return func(yield func(*Resp, error) bool) {
		msg, err := json.Marshal(req)
		if err != nil {
			yield(nil, err)
			return
		}
		var body bytes.Buffer
		WriteEnvelope(&body, 0, msg)
		hdr := http.Header{}
		if timeout > 0 {
			hdr.Set("Connect-Timeout-Ms", strconv.FormatInt(max(timeout.Milliseconds(), 1), 10))
		}
		resp, err := c.do(ctx, EnvdPort, http.MethodPost, procedure, "application/connect+json", hdr, &body)
		if err != nil {
			yield(nil, err)
			return
		}
		defer resp.Body.Close()
		for {
			flags, data, err := ReadEnvelope(resp.Body, MaxResponse)
			switch {
			case errors.Is(err, ErrTooLarge):
				yield(nil, err)
				return
			case err == io.EOF:
				yield(nil, errors.New("stream ended without its end"))
				return
			case err != nil:
				yield(nil, fmt.Errorf("stream ended early: %w", err))
				return
			}
			if flags&FlagEndStream != 0 {
				var end EndStream
				if err := json.Unmarshal(data, &end); err != nil {
					yield(nil, fmt.Errorf("end of stream: %w", err))
				} else if end.Error != nil {
					yield(nil, end.Error)
				}
				return
			}
			m := new(Resp)
			if err := json.Unmarshal(data, m); err != nil {
				yield(nil, fmt.Errorf("stream message: %w", err))
				return
			}
			if !yield(m, nil) {
				return
			}
		}
	}
}
