"""pytest fixture `real_node` (module): a real kubelet node joined to `k8s_cluster`.

Skipped, with the exact reason, where the machine cannot run one (not root, no mount
namespaces, containerd/runc/busybox-static/iproute2 missing, no kubelet built) or where another
real node already runs on it (one per machine; module scope, so a test module of its own can
run `egpu sandbox up --real-nodes 1`). The node is tainted `elasticgpu.io/real-node`
(`REAL_NODE_TOLERATION` lets a pod in), so pods of other tests never land on it. Torn down after
the module: no process, mount, cgroup or state is left, and the Node is deleted.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.realnode import RealNode, RealNodeBusy, unavailable_reason
from elastic_gpu.devcluster.realnode_ns import lock_holder

REAL_NODE_NAME = "egpu-real-0"


def skip_unless_real_node_possible(bin_dir: Path) -> None:
    """pytest.skip, saying exactly why, where this machine cannot run a real node now."""
    reason = unavailable_reason(bin_dir)
    if reason is not None:
        pytest.skip(f"this machine cannot run a real kubelet node: {reason}")
    holder = lock_holder()
    if holder is not None:
        pytest.skip(f"a real node already runs on this machine (pid {holder} holds "
                    "@egpu-realnode; one per machine): stop it (`egpu sandbox down`)")


@pytest.fixture(scope="module")
def real_node(k8s_cluster: ControlPlane) -> Iterator[RealNode]:
    skip_unless_real_node_possible(k8s_cluster.bin_dir)
    # A short work dir: device-plugin and containerd sockets live under it (unix socket paths
    # are limited to 107 bytes).
    work = Path(tempfile.mkdtemp(prefix="egpu-rn-"))
    node = RealNode(REAL_NODE_NAME, work, k8s_cluster, die_with_parent=True)
    try:
        node.start()
    except RealNodeBusy as err:  # another run's node took the machine since the check above
        shutil.rmtree(work, ignore_errors=True)
        pytest.skip(f"this machine's one real node is taken: {err}")
    try:
        yield node
    finally:
        node.stop(delete_node=True)
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["REAL_NODE_NAME", "real_node", "skip_unless_real_node_possible"]
