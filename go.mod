module github.com/airlock-sandbox/airlock

go 1.26.0

require (
	github.com/landlock-lsm/go-landlock v0.11.2
	golang.org/x/sys v0.50.0
)

require (
	github.com/go-zeromq/goczmq/v4 v4.2.2 // indirect
	github.com/go-zeromq/zmq4 v0.17.0 // indirect
	github.com/opencontainers/runtime-spec v1.2.1 // indirect
	golang.org/x/sync v0.7.0 // indirect
	golang.org/x/text v0.15.0 // indirect
	kernel.org/pub/linux/libs/security/libcap/psx v1.2.78 // indirect
)
