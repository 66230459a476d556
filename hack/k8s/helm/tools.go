//go:build tools

// Package tools pins the helm command built by hack/ensure-k8s.sh.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
