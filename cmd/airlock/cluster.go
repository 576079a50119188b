package main

import (
	"github.com/airlock-sandbox/airlock/internal/clusterbin"
)

// A cluster on Kubernetes (README, "Many hosts"): airlock router, and
// airlock serve --node-name (package daemon), run the cluster binary
// (cmd/airlock-cluster), which alone links Kubernetes' client packages.

// routerCmd is airlock router: the cluster binary's router, in place of
// this process.
func routerCmd(args []string) error {
	return clusterbin.Exec(append([]string{"router"}, args...)...)
}
