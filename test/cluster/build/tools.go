//go:build tools

// Keeps kube-apiserver's main package in this module's graph so that
// `go mod tidy` records every module it needs.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
