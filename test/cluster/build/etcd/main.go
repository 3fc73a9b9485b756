// Command etcd is etcd's own server entry point, wrapped so that it builds
// from the etcd version that kube-apiserver's module graph selects.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
