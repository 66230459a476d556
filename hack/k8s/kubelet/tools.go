//go:build tools

// Package tools pins the kubelet command built by hack/ensure-k8s.sh.
package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
