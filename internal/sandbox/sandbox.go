package sandbox

import (
	"context"
	"crypto/subtle"
	"net/http"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentproto"
	"github.com/airlock-sandbox/airlock/internal/backend"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Sandbox is a claimed sandbox, as the API describes it.
type Sandbox struct {
	ID          string
	TemplateID  string
	ClientID    string
	AccessToken string // for the agent's envd port (X-Access-Token)
	// TrafficToken opens the sandbox's other ports, such as the code
	// interpreter's (E2B-Traffic-Access-Token); AccessToken does too.
	TrafficToken string
	Metadata     map[string]string
	StartedAt    time.Time
	CPUs         float64
	MemoryMB     int64
	DiskMB       int64
	// AutoResume: traffic to the sandbox while paused resumes it.
	AutoResume bool
	Ingress    Ingress
	// VolumeMounts are the volumes mounted into it.
	VolumeMounts []VolumeMount

	inst Instance // nil while saved (below); read it with instance()
	// net is its box's network (nil: loopback only, or no box); pol's
	// Network its policy while it has no box. Both change under mu and
	// netMu; Network reads them under netMu alone.
	net       NetAttachment
	netMu     sync.Mutex
	pol       policy.Policy // what it was started with, for a restore
	be        Backend
	ended     chan struct{} // closed when it is removed
	transport *http.Transport
	ports     *http.Transport // to the sandbox's own servers, through the agent

	clock Clock // the manager's, for its CPU share

	mu    sync.Mutex
	endAt time.Time
	timer Timer
	// The CPU time used at the last Usage call (or the claim) and when:
	// the next call's CPU share is over the time between. The history's
	// sampler keeps a mark of its own, so that neither shortens the
	// other's interval.
	apiMark, sampleMark cpuMark
	// state is where it is in its lifecycle (state.go); only
	// Manager.transition changes it.
	state State
	// autoPause: the end of its time to live pauses it instead of
	// killing it (keeping only its files if autoPauseFiles).
	autoPause, autoPauseFiles bool
	// savedName: while Saved, the backend's name for it saved to disk.
	savedName string
	// env: the environment variables it was created with, which a new
	// box started for it at a resume from SavedFiles is given again.
	env     map[string]string
	history []Sample // the sampler's, oldest first
	// log is its log for its client (log.go), with a lock of its own.
	log eventLog
	// private: found by no client of the API (CreateRequest.Private).
	private bool
	// atStart is what its box had counted when it was handed out.
	atStart backend.Usage
	// refill, if set, is the pool it was claimed from, which refills
	// when it ends (CreateRequest.PoolOnly).
	refill *pool
}

// instance is the box that runs s; nil while s is saved.
func (s *Sandbox) instance() Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inst
}

// OnTimeout is what the end of s's time to live does: "pause" or "kill".
func (s *Sandbox) OnTimeout() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.autoPause {
		return "pause"
	}
	return "kill"
}

// State is where s is in its lifecycle.
func (s *Sandbox) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Paused reports whether s is paused, as E2B's API shows it.
func (s *Sandbox) Paused() bool { return s.State().paused() }

// EndAt is when the sandbox's time to live runs out.
func (s *Sandbox) EndAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endAt
}

// Transport reaches the sandbox's agent.
func (s *Sandbox) Transport() http.RoundTripper { return s.transport }

// CheckToken reports whether token is this sandbox's access token, in
// constant time.
func (s *Sandbox) CheckToken(token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(s.AccessToken)) == 1
}

// CheckTrafficToken reports whether token is this sandbox's traffic token.
func (s *Sandbox) CheckTrafficToken(token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(s.TrafficToken)) == 1
}

// Usage is what a sandbox uses, for the metrics API.
type Usage struct {
	// CPUPercent is the share of its CPU limit it used since the previous
	// Usage call, or since it was handed out: 0 to 100.
	CPUPercent float64
	Memory     int64 // bytes in use
	Cache      int64 // of Memory, the page cache of files
	Disk       int64 // bytes its writable file systems hold
}

// Usage measures s now. Its disk use comes from the backend where the
// host measures it, or else from the agent, which is as untrusted as the
// code: it is bounded, and only ever shown to the sandbox's own client;
// an agent that does not answer counts as 0.
func (s *Sandbox) Usage(ctx context.Context) (Usage, error) { return s.usage(ctx, &s.apiMark) }

// cpuMark is a sandbox's CPU time so far at a moment.
type cpuMark struct {
	cpu time.Duration
	at  time.Time
}

// usage is Usage with the CPU share since mark, which moves to now.
func (s *Sandbox) usage(ctx context.Context, mark *cpuMark) (Usage, error) {
	inst := s.instance()
	if inst == nil {
		return Usage{}, nil // saved to disk: it uses no memory, no CPU
	}
	bu, err := inst.Usage(ctx)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{Memory: bu.Memory, Cache: bu.Cache}
	switch {
	case bu.DiskMeasured:
		u.Disk = bu.Disk
	case !s.Paused(): // a paused agent answers nothing
		u.Disk = s.diskUsage(ctx)
	}
	u.Disk = min(max(u.Disk, 0), s.DiskMB<<20)
	now := s.clock.Now()
	s.mu.Lock()
	if dt := now.Sub(mark.at); dt > 0 && s.CPUs > 0 {
		u.CPUPercent = min(max(100*float64(bu.CPU-mark.cpu)/float64(dt)/s.CPUs, 0), 100)
	}
	*mark = cpuMark{bu.CPU, now}
	s.mu.Unlock()
	return u, nil
}

func (s *Sandbox) diskUsage(ctx context.Context) int64 {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d, err := (&agentproto.Client{Transport: s.transport}).Disk(ctx)
	if err != nil {
		return 0
	}
	return d.Used
}

// BackendName is the name of the backend the sandbox runs on.
func (s *Sandbox) BackendName() string { return s.be.Name() }

// Network is the sandbox's network policy now, and whether it has a
// network at all.
func (s *Sandbox) Network() (policy.Network, bool) {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	if s.net != nil {
		return s.net.Policy(), true
	}
	return s.pol.Network, s.pol.Network.Mode != policy.NetNone
}

// setNetwork makes att the sandbox's network (nil while it has no box:
// saved), and pol the network policy it keeps for its next one; s.mu is
// held.
func (s *Sandbox) setNetwork(att NetAttachment, pol policy.Network) {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	s.net, s.pol.Network = att, pol
}

// Done is closed when the sandbox has ended, whatever the reason.
func (s *Sandbox) Done() <-chan struct{} { return s.ended }

// PortTransport reaches the servers that processes in the sandbox run.
func (s *Sandbox) PortTransport() http.RoundTripper { return s.ports }
