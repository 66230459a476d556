"""Two extender processes, one Lease: SIGKILL the leader under a steady stream of GPU pods and
the standby takes over; nothing is lost or given twice.

Real parts: kube-apiserver, etcd, kube-scheduler and kwok of the dev control plane, and two
`egpu scheduler` processes. The one stand-in is `devcluster.readyproxy`, for the Service and
kube-proxy the dev control plane does not run: it sends each connection to the replica whose
/readyz answers 200. The checks read the pods back from the API (annotations summed per card,
`egpu_testing.scenario.check`), not either replica's state. bench/sched_failover.py times 20+
kills with the same parts.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.failover import ExtenderPair, stream_pods
from egpu_testing.scenario import Progress, check, fractional_pods, list_pods
from egpu_testing.workbench import extender_kube_scheduler_config, pod_manifest
from elastic_gpu.devcluster.nodes import fake_inventory

pytestmark = pytest.mark.integration

NODES = 6
PODS = 200  # more than 48 cards hold (~130), so the cards fill and some pods must wait
PER_SECOND = 12.0


@pytest.fixture
def pair(k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> Iterator[ExtenderPair]:
    from elastic_gpu.agent.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    replicas = ExtenderPair(k8s_cluster.kubeconfig, tmp_path, k8s_namespace)
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()


def _settle(client: Any, namespace: str, total: int, quiet_s: float = 20.0,
            timeout_s: float = 300.0) -> None:
    """Until every pod is bound, or the bound count has not moved for `quiet_s` (longer than
    kube-scheduler's 10 s maximum backoff)."""
    started = last_change = time.monotonic()
    last = -1
    while time.monotonic() - started < timeout_s:
        pods = list_pods(client, namespace)
        bound = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
        if bound != last:
            last, last_change = bound, time.monotonic()
        if (len(pods) == total and bound == total) or time.monotonic() - last_change > quiet_s:
            return
        time.sleep(0.5)


def test_sigkill_of_the_leader_under_a_stream_loses_nothing_and_gives_nothing_twice(
        k8s_cluster: Any, pair: ExtenderPair, start_kube_scheduler: Callable[..., Any],
        fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    nodes = [fake_inventory(name, gpus=8) for name in fake_gpu_nodes(NODES, gpus=8)]
    leader = pair.wait_leader()
    standby = pair.standby_of(leader)
    assert leader is pair.replicas[0]

    # the standby refuses every verb (kube-scheduler retries) and writes nothing
    status, text = standby.readyz()
    assert status == 503 and "standing by" in text and "caches synced" in text
    probe = pod_manifest("probe", k8s_namespace, limits={"elasticgpu.io/gpu-core": "10"})
    request = urllib.request.Request(
        f"{standby.url}/filter", data=json.dumps({"Pod": probe, "NodeNames": [nodes[0].name]})
        .encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 503
    assert "does not serve" in json.loads(refused.value.read())["Error"]

    start_kube_scheduler(extender_kube_scheduler_config(pair.url, pair.scheduler_name))
    client = k8s_cluster.client()
    pods = fractional_pods(PODS, pair.scheduler_name, k8s_namespace, seed=29, prefix="ha")
    progress = Progress()
    stream = stream_pods(client, pods, PER_SECOND, progress, stop=threading.Event())

    # SIGKILL the leader a third of the way into the stream, while pods keep coming
    deadline = time.monotonic() + 120
    while progress.created < PODS // 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    bound_before = sum(1 for p in list_pods(client, k8s_namespace)
                       if (p.get("spec") or {}).get("nodeName"))
    assert bound_before > 0, "nothing was bound before the kill:\n" + pair.log_tails()
    leader.kill()
    survivor = pair.wait_leader(other_than=leader)
    assert survivor is standby

    stream.join(timeout=120)
    assert progress.created == PODS
    _settle(client, k8s_namespace, PODS)
    current = list_pods(client, k8s_namespace)
    over, lost, unfit = check(current, nodes)
    bound = sum(1 for p in current if (p.get("spec") or {}).get("nodeName"))
    summary = f"{bound}/{PODS} bound ({bound_before} before the kill)"
    assert not over, f"over-allocated: {over[:3]}; {summary}"
    assert not lost, f"lost: {lost[:3]}; {summary}"
    assert not unfit, f"pending but would fit: {unfit[:3]}; {summary}\n{pair.log_tails()}"
    assert bound > bound_before  # the new leader bound pods
    assert bound >= 2 * NODES * 8, summary  # the cards really filled up (~2.5 pods a card)
    assert pair.leader() is survivor


def test_sigterm_of_the_leader_hands_the_lease_over_at_once(
        k8s_cluster: Any, pair: ExtenderPair) -> None:
    from lightkube.resources.coordination_v1 import Lease

    leader = pair.wait_leader()
    standby = pair.standby_of(leader)
    leader.stop()  # SIGINT/SIGTERM: drain, then release the Lease
    assert leader.process is not None and leader.process.returncode == 0
    # released, not left to expire: the holder is already emptied (or the standby's)
    lease = k8s_cluster.client().get(Lease, name=pair.lease, namespace=pair.namespace)
    assert lease.spec.holderIdentity != "a", pair.log_tails()
    assert pair.wait_leader(other_than=leader) is standby
