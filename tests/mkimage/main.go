// Command mkimage serves a registry on loopback with a small image in it,
// for tests that pull images: busybox (Debian's busybox-static) with its
// applets, as "busybox:latest". It prints REGISTRY=127.0.0.1:PORT and
// serves until its standard input closes.
package main

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/airlock-sandbox/airlock/internal/image/imagetest"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	img, err := imagetest.BusyboxImage([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "FROM_IMAGE=busybox"}, "", nil...)
	if err != nil {
		log.Fatal(err)
	}
	ref, err := name.ParseReference(ln.Addr().String() + "/busybox:latest")
	if err != nil {
		log.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("REGISTRY=%s\n", ln.Addr())
	io.Copy(io.Discard, bufio.NewReader(os.Stdin))
}
