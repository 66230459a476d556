//go:build tools

// Package tools pins the kwok command built by hack/ensure-k8s.sh.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
