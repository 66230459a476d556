//go:build tools

// Package tools pins the etcd server command built by hack/ensure-k8s.sh.
package tools

import _ "go.etcd.io/etcd/server/v3"
