//go:build tools

// Package tools pins the containerd commands built by hack/ensure-k8s.sh for the real node:
// containerd 2 reads CDI specs (the DRA kubelet plugin's devices), which Debian's 1.6 does not.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
