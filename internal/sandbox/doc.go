// Package sandbox manages the sandboxes of one Airlock host: creation
// (claimed from warm pools), lookup, time-to-live, pause and teardown.
//
// Where to find what:
//
//   - manager.go: the Manager, its Config, NewManager and Shutdown.
//   - sandbox.go: a Sandbox as the API sees it; errors.go: the errors
//     the API maps to statuses.
//   - state.go: a sandbox's lifecycle, one State and the table of the
//     moves each operation may make.
//   - create.go: a create, from the request to a registered sandbox;
//     box.go: starting, readying and discarding the backend's boxes;
//     agent.go: reaching the agent in a box.
//   - registry.go: ids, lookup, lists, and removal.
//   - ttl.go: time to live; clock.go: the manager's time (a fake one in
//     tests).
//   - pause.go: pause and resume, which keep a sandbox in memory or
//     hand it to persistence (below).
//   - pool.go: warm pools and their refill; hostroom.go: whether the
//     host has room for another box.
//   - network.go: sandboxes with a network of their own.
//   - persistence: savedisk.go (a pause to disk, and the restore),
//     savedfiles.go (a pause that keeps only the files), saved.go (the
//     records of saved sandboxes, found again after a restart),
//     snapshot.go and fork.go (copies of a running sandbox), warm.go
//     (templates whose sandboxes are clones of a ready one).
//   - private.go: boxes the daemon runs for itself (template builds).
//   - metrics.go, history.go: counters and each sandbox's samples.
//   - tokens.go: sandboxes' access and traffic tokens.
package sandbox
