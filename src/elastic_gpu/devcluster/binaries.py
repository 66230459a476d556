"""Where the dev cluster's binaries are: built by hack/ensure-k8s.sh, cached by version.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
kwok) lives in one cache directory; kubelet (the real node) and helm (the chart tests) are
built under keys of their own and linked into it, so one directory holds them all."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from elastic_gpu.devcluster.errors import MissingBinariesError

#: What every dev cluster needs: `find_bin_dir` insists on these.
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
            "kwok")
#: Built and linked into the same directory by hack/ensure-k8s.sh, but needed only by their
#: users (a real node, the chart tests), which check for them and say so: a sandbox of fake
#: nodes runs without them.
TOOLS = ("kubelet", "helm")
ENV_BIN_DIR = "EGPU_K8S_BIN_DIR"


def ensure_script() -> Path | None:
    """hack/ensure-k8s.sh of the source checkout this package runs from, if any."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "hack" / "ensure-k8s.sh"
        if candidate.is_file():
            return candidate
    return None


def _check(bin_dir: Path, where: str) -> Path:
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if missing:
        raise MissingBinariesError(where, missing)
    return bin_dir


def find_bin_dir(explicit: Path | str | None = None) -> Path:
    """The directory holding all of `BINARIES` (and `TOOLS`, where built); never builds
    (that takes minutes).

    Order: `explicit`, then $EGPU_K8S_BIN_DIR, then the cache directory that
    `hack/ensure-k8s.sh --check` reports for the pinned versions of this checkout.
    """
    if explicit is not None:
        return _check(Path(explicit), str(explicit))
    env = os.environ.get(ENV_BIN_DIR)
    if env:
        return _check(Path(env), f"{env} (from ${ENV_BIN_DIR})")
    script = ensure_script()
    if script is None:
        raise MissingBinariesError(f"${ENV_BIN_DIR} (not set; no hack/ensure-k8s.sh found)",
                                   list(BINARIES))
    result = subprocess.run([str(script), "--check"], capture_output=True, text=True,
                            check=False)
    lines = result.stdout.strip().splitlines()
    if not lines:  # the script itself failed (e.g. a broken checkout): show why
        raise MissingBinariesError(f"{script} --check: {result.stderr.strip()}",
                                   list(BINARIES))
    # Exit status 1 means some are missing; _check names which.
    return _check(Path(lines[-1]), lines[-1])
