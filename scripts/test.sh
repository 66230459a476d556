#!/usr/bin/env bash
# The whole test suite: lint, types, unit and integration tests against a real control plane.
# Installs what it needs (Python packages; the real node's Debian packages; etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, kubelet and helm built from Go modules
# and cached outside the tree by hack/ensure-k8s.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/realnode-packages.sh  # containerd, runc, busybox-static for the real-node tests (root)
echo "== control-plane binaries"
EGPU_K8S_BIN_DIR=$(hack/ensure-k8s.sh | tail -n 1)
export EGPU_K8S_BIN_DIR
echo "   $EGPU_K8S_BIN_DIR"
echo "== ruff"
.venv/bin/ruff check src tests bench
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
.venv/bin/pytest "$@"
