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
# EGPU_TEST_WORKERS pytest-xdist workers, each with its own control plane (tests/conftest.py says
# how the suite is split); 1 runs the suite serially in this process. Arguments go to pytest after
# ours, so `scripts/test.sh -n 0 tests/unit` overrides the worker count too.
workers=${EGPU_TEST_WORKERS:-2}
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "EGPU_TEST_WORKERS must be a positive integer (got '$workers')" >&2; exit 2; }
xdist=()
(( workers > 1 )) && xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
echo "== pytest (${workers} worker(s))"
.venv/bin/pytest "${xdist[@]}" "$@"
