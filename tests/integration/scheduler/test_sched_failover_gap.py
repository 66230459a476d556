"""Pods that meet the extender's failover (issue 39): while no replica serves, every attempt of
a GPU pod is an error and kube-scheduler backs the pod off; with its default backoff (1, 2, 4,
8, 10 s per consecutive error) a pod tried early in the gap waits out a backoff of seconds
after the new leader serves. The configuration we ship bounds it to 1 s
(`schedconfig.POD_MAX_BACKOFF_S`): a pod that has failed many times is tried as often as one
that has just arrived, and every pod created during the failover is bound once a replica
serves.

Real parts: kube-apiserver, etcd, kube-scheduler (the shipped configuration) and kwok of the
dev control plane, two `egpu scheduler` processes, `devcluster.readyproxy` for the Service
(with no ready replica it closes each connection, as a Service without endpoints refuses it).
Which attempts failed is read from kube-scheduler's own log, in its order: no clock is compared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.failover import ExtenderPair
from egpu_testing.failover_gap import failed_attempts, running_pair
from egpu_testing.scenario import list_pods
from egpu_testing.workbench import extender_kube_scheduler_config, pod_manifest

pytestmark = pytest.mark.integration

#: the failures of the first pod before the second arrives: with kube-scheduler's default
#: backoff the first then waits 8 s for its next try, with the shipped one 1 s
DEEP = 4


@pytest.fixture
def pair(k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> Iterator[ExtenderPair]:
    with running_pair(k8s_cluster, k8s_namespace, tmp_path) as replicas:
        yield replicas


def test_pods_created_while_no_extender_serves_are_retried_every_second_and_all_bound(
        k8s_cluster: Any, pair: ExtenderPair, start_kube_scheduler: Callable[..., Any],
        fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    fake_gpu_nodes(2, gpus=8)
    scheduler = start_kube_scheduler(extender_kube_scheduler_config(pair.url,
                                                                    pair.scheduler_name))
    client = k8s_cluster.client()
    leader = pair.wait_leader()
    standby = pair.standby_of(leader)
    created: list[str] = []

    def create(name: str) -> None:
        client.create(_pod(name, k8s_namespace, pair.scheduler_name))
        created.append(name)

    def failures() -> list[str]:
        return failed_attempts(scheduler.process.log_path.read_text(errors="replace"),
                               k8s_namespace)

    def until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        while not done():
            assert time.monotonic() < deadline, f"{what}; failed attempts: {failures()}"
            create(f"gap-{len(created):03d}")  # pods keep arriving through the gap
            time.sleep(0.5)

    # the failover's gap, held open by the test: the leader SIGKILLed, the standby with it
    standby.kill()
    leader.kill()
    create("first")
    until(lambda: failures().count("first") >= DEEP, f"'first' failed {DEEP} times")
    create("second")
    until(lambda: failures().count("second") >= DEEP, f"'second' failed {DEEP} times")

    # the pod deep in its backoff was tried again while the new one failed its first DEEP
    # times: kube-scheduler's default would have left it waiting 8 s, untried
    log = failures()
    starts, ends = log.index("second"), _nth(log, "second", DEEP)
    assert log[starts:ends].count("first") >= 2, log

    # a replica serves again: every pod created during the failover is bound
    standby.start(standby=True)
    pair.wait_leader()
    deadline = time.monotonic() + 120
    while (unbound := _unbound(client, k8s_namespace, created)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not unbound, f"not bound: {unbound}\n{pair.log_tails()}"
    assert len(created) > 2 * DEEP


def _pod(name: str, namespace: str, scheduler_name: str) -> Any:
    from lightkube import codecs

    return codecs.from_dict(pod_manifest(name, namespace,
                                         limits={"elasticgpu.io/gpu-core": "10",
                                                 "elasticgpu.io/gpu-memory": "1024"},
                                         scheduler_name=scheduler_name))


def _nth(items: list[str], item: str, n: int) -> int:
    """The index of the `n`th occurrence of `item` (1-based)."""
    return [i for i, x in enumerate(items) if x == item][n - 1]


def _unbound(client: Any, namespace: str, names: list[str]) -> list[str]:
    bound = {p["metadata"]["name"] for p in list_pods(client, namespace)
             if (p.get("spec") or {}).get("nodeName")}
    return [n for n in names if n not in bound]
