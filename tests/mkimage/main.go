// Command mkimage serves a registry on loopback with small images in it,
// for tests that pull images: busybox (Debian's busybox-static) with its
// applets, as "busybox:latest", and, with -root DIR, the root file system
// in DIR (tests/fixtures/debian-root.sh makes one) as "debian:latest". It
// prints REGISTRY=127.0.0.1:PORT and serves until its standard input
// closes.
package main

import (
	"archive/tar"
	"bufio"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-sandbox/airlock/internal/image/imagetest"
)

func main() {
	root := flag.String("root", "", "a root file system to serve as debian:latest")
	listen := flag.String("listen", "127.0.0.1:0", "address to serve the registry at (a test's own: loopback, or a bridge it made)")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
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
	if *root != "" {
		if err := pushRoot(ln.Addr().String()+"/debian:latest", *root); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("REGISTRY=%s\n", ln.Addr())
	io.Copy(io.Discard, bufio.NewReader(os.Stdin))
}

// pushRoot pushes the directory dir as a one-layer image: its files with
// their owners and modes, device nodes and sockets left out.
func pushRoot(ref, dir string) error {
	tmp, err := os.CreateTemp("", "mkimage-layer-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket|fs.ModeNamedPipe) != 0:
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname = rel, "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, fi.Size())
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromFile(tmp.Name())
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	return remote.Write(r, img)
}
