//go:build tools

// Keeps the main packages of kube-apiserver and kubectl in this module's graph so that
// `go mod tidy` records every module it needs.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
