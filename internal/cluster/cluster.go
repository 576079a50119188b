// Package cluster runs Airlock on many hosts through a Kubernetes API
// server, never through a protocol of its own: each host's daemon (a
// node) registers itself there with a Lease and an AirlockNode, and
// watches AirlockPools for its pool sizes; routers (router.go) read the
// same objects to send each request to the node that holds its sandbox.
//
// A sandbox's id names its node: the first six hex digits after the "i"
// are the node's IDPrefix, so a router needs no shared table on the hot
// path, and a node that is gone takes its sandboxes with it.
package cluster

import (
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlock-sandbox/airlock/internal/sandboxid"
)

// Group and Version of Airlock's custom resources (deploy/kubernetes).
const (
	Group   = "airlock-sandbox.github.io"
	Version = "v1alpha1"
)

var (
	nodesResource     = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "airlocknodes"}
	poolsResource     = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "airlockpools"}
	templatesResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "airlocktemplates"}
	leasesResource    = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
)

// LeaseDuration is how long a node counts as alive after it last
// renewed its Lease; it renews three times as often.
const LeaseDuration = 10 * time.Second

// IDPrefix is what the ids of node's sandboxes begin with after their
// "i" (sandboxid.NodePrefix). A node refuses to register while a live
// node of another name has the same prefix.
func IDPrefix(node string) string { return sandboxid.NodePrefix(node) }

// prefixOf is the node prefix of sandbox id, "" if id is no sandbox id.
func prefixOf(id string) string { return sandboxid.NodeOf(id) }

// Client connects to the API server: with the kubeconfig at path, or,
// when path is "", with the pod's service account (in a cluster).
func Client(kubeconfig string) (dynamic.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("not in a cluster, and no --kubeconfig given: %v", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %v", kubeconfig, err)
		}
	}
	cfg.UserAgent = "airlock"
	return dynamic.NewForConfig(cfg)
}

// Namespace is where Airlock's objects live: the flag's value, else
// $AIRLOCK_NAMESPACE, else the pod's own namespace, else "airlock".
func Namespace(flag string) string {
	if flag != "" {
		return flag
	}
	if ns := os.Getenv("AIRLOCK_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "airlock"
}

// leaseExpiry is when the Lease u stops vouching for its holder; zero
// if it is not a valid lease.
func leaseExpiry(u *unstructured.Unstructured) time.Time {
	renew, _, _ := unstructured.NestedString(u.Object, "spec", "renewTime")
	secs, _, _ := unstructured.NestedInt64(u.Object, "spec", "leaseDurationSeconds")
	t, err := time.Parse(time.RFC3339Nano, renew)
	if err != nil || secs <= 0 {
		return time.Time{}
	}
	return t.Add(time.Duration(secs) * time.Second)
}

// microTime is a Kubernetes MicroTime, as a Lease's renewTime is written.
func microTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
}
