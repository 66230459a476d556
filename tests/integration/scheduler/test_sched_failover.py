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

from egpu_testing.claims import install_crds
from egpu_testing.claims_burst import register_kinds
from egpu_testing.controller import clean_up
from egpu_testing.failover import (
    COMPONENTS,
    BindClock,
    ClaimClock,
    ControllerPair,
    ExtenderPair,
    FailoverRig,
    ObjectStream,
    WebhookPair,
    create_immediate_class,
    interleave,
    read_ledger,
    share_claims,
    stream_pods,
)
from egpu_testing.failover_gap import running_pair
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import Progress, check, fractional_pods, list_pods
from egpu_testing.webhook import wait_in_force
from egpu_testing.workbench import extender_kube_scheduler_config, pod_manifest
from elastic_gpu.devcluster.nodes import fake_inventory

pytestmark = pytest.mark.integration

NODES = 6
PODS = 200  # more than 48 cards hold (~130), so the cards fill and some pods must wait
PER_SECOND = 12.0


@pytest.fixture
def pair(k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> Iterator[ExtenderPair]:
    with running_pair(k8s_cluster, k8s_namespace, tmp_path) as replicas:
        yield replicas


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


ALL_NODES = 8  # 640 slots of 10%: the stream below never fills them, so everything must bind
STREAM_PER_SECOND = 6.0


def test_sigkill_of_extender_webhook_and_controller_alone_and_together_under_a_stream(
        k8s_cluster: Any, start_kube_scheduler: Callable[..., Any],
        fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str, tmp_path: Path) -> None:
    """The three replicated services under one stream of GPU pods and Immediate claims: the
    serving extender, the webhook replica carrying kube-apiserver's connections, the
    controller leader SIGKILLed one at a time and then all together. After each kill pods
    and claims created after it are bound again; at the end every pod is bound, every claim
    Bound, nothing given twice (cards summed over the pods and the ElasticGPUs, read back
    from the API), and every create the dying webhook refused went through on a retry."""
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    install_crds(k8s_cluster)
    register_kinds()
    nodes = [fake_inventory(name, gpus=8) for name in fake_gpu_nodes(ALL_NODES, gpus=8)]
    client = k8s_cluster.client()
    extenders = ExtenderPair(k8s_cluster.kubeconfig, tmp_path, k8s_namespace)
    webhooks = WebhookPair(k8s_cluster.kubeconfig, tmp_path, "egpu-failover")
    # the chart's Lease settings (15 / 10 / 2 s): a shorter renew deadline loses the Lease on
    # a loaded machine (the replica exits to come back as a follower)
    controllers = ControllerPair(k8s_cluster.kubeconfig, tmp_path, k8s_namespace,
                                 extenders.url)
    class_name = unique_name("failover")
    stop = threading.Event()
    try:
        extenders.start()
        webhooks.start()
        k8s_cluster.kubectl("label", "namespace", k8s_namespace,
                            f"{webhooks.label}={webhooks.name}")
        wait_in_force(k8s_cluster, k8s_namespace)
        controllers.start()
        create_immediate_class(k8s_cluster, class_name)
        start_kube_scheduler(extender_kube_scheduler_config(extenders.url,
                                                            extenders.scheduler_name))
        pods = [pod_manifest(f"ha-{i:04d}", k8s_namespace,
                             limits={"elasticgpu.io/gpu-core": "10",
                                     "elasticgpu.io/gpu-memory": "1024"},
                             scheduler_name=extenders.scheduler_name) for i in range(400)]
        claims = share_claims(150, k8s_namespace, class_name)
        stream = ObjectStream(client, interleave(pods, claims), STREAM_PER_SECOND, stop=stop)
        with BindClock(client, k8s_namespace).running() as pod_clock, \
                ClaimClock(client, k8s_namespace).running() as claim_clock:
            rig = FailoverRig(client, extenders, webhooks, controllers, stream, pod_clock,
                              claim_clock)
            rig.ready()
            feeder = stream.start()
            results = []
            for targets in (["extender"], ["webhook"], ["controller"], list(COMPONENTS)):
                rig.ready()
                time.sleep(2.0)  # binding under the stream before each kill
                assert feeder.is_alive(), "the stream ended before the kills were done"
                results.append(rig.kill(targets))
                print(results[-1].line())
            stop.set()
            feeder.join(timeout=60)
            assert not stream.given_up, stream.given_up[:3]
            total = stream.progress.created
            _settle_all(client, k8s_namespace, pod_clock, claim_clock, stream)
        report = read_ledger(k8s_cluster, client, k8s_namespace, nodes)
        logs = extenders.log_tails() + controllers.log_tails() + webhooks.log_tails()
        assert report.ok, report.summary() + logs
        created_claims = [n for n in stream.created_at if n.startswith("claim-")]
        assert report.claims.bound == report.claims.claims == len(created_claims), \
            report.summary() + logs
        assert report.pods_bound == report.pods == total - len(created_claims), \
            report.summary() + logs
        # each round's objects bound again after the kill, by the survivors
        assert [r.killed for r in results] == [("extender",), ("webhook",), ("controller",),
                                               COMPONENTS]
        assert all(r.pod_bound_s > 0 and r.claim_bound_s > 0 for r in results)
        # the dying webhook refused creates only while it was being routed to: every one of
        # them went through on a retry (none given up above), and the survivors took over
        # the admissions (the stream's last objects went through them)
        assert webhooks.answered()[0] + webhooks.answered()[1] > 0
    finally:
        stop.set()
        controllers.stop()
        webhooks.stop(k8s_cluster)
        extenders.stop()
        clean_up(k8s_cluster, k8s_namespace, classes=[class_name])


def _settle_all(client: Any, namespace: str, pods: Any, claims: Any, stream: ObjectStream,
                timeout_s: float = 120.0) -> None:
    """Until every pod and claim the stream created is bound / Bound (the clocks saw it), or
    `timeout_s`: the checks then say what is missing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        names = set(stream.created_at)
        if names <= set(pods.seen_at) | set(claims.seen_at):
            return
        time.sleep(0.5)
