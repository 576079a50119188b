package cluster

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// client-go's fake dynamic client keeps AirlockNodes, Leases, pools and
// templates as an API server would (get, list, watch, create, patch,
// delete), for the tests that need no real one.

// fakeClient is a dynamic client holding objs, which knows the lists of
// Airlock's resources and of Leases.
func fakeClient(objs ...runtime.Object) *fakeDynamic {
	return &fakeDynamic{dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		nodesResource: "AirlockNodeList", leasesResource: "LeaseList",
		poolsResource: "AirlockPoolList", templatesResource: "AirlockTemplateList",
	}, objs...)}
}

// fakeDynamic is the fake client, whose resources say, as the client
// itself does, that they list as lists, not as streams of watch events
// (an informer asks the resource it is given).
type fakeDynamic struct{ *dynamicfake.FakeDynamicClient }

func (c *fakeDynamic) Resource(r schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return fakeResource{c.FakeDynamicClient.Resource(r)}
}

type fakeResource struct {
	dynamic.NamespaceableResourceInterface
}

func (r fakeResource) Namespace(ns string) dynamic.ResourceInterface {
	return fakeNamespaced{r.NamespaceableResourceInterface.Namespace(ns)}
}

type fakeNamespaced struct{ dynamic.ResourceInterface }

func (fakeNamespaced) IsWatchListSemanticsUnSupported() bool { return true }
