"""Many fractional pods at once, and the extender SIGKILLed in the middle of it.

Small versions (fit the 2-core test machine); bench/sched_burst.py runs the full 2,000 pods
on 200 eight-card nodes with the same code and checks. The checks read the pods back from the
API (annotations summed per card), not the scheduler's state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.scenario import fractional_pods, run_burst
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config
from elastic_gpu.devcluster.nodes import fake_inventory
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

NODES = 10
PODS = 300  # about 1.2x what 80 cards hold, so the cluster fills and some pods must wait


@pytest.fixture
def extender(k8s_cluster: Any, tmp_path: Path) -> Iterator[ExtenderProcess]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    (port,) = free_ports(1)
    process = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log")
    process.start()
    yield process
    process.stop()


def _cluster(fake_gpu_nodes: Callable[..., list[str]]) -> list[Any]:
    return [fake_inventory(name, gpus=8) for name in fake_gpu_nodes(NODES, gpus=8)]


def test_burst_never_overcommits_and_binds_every_pod_that_fits(
        k8s_cluster: Any, extender: ExtenderProcess, start_kube_scheduler: Callable[..., Any],
        fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    nodes = _cluster(fake_gpu_nodes)
    name = extender.scheduler_name
    start_kube_scheduler(extender_kube_scheduler_config(extender.url, name))
    pods = fractional_pods(PODS, name, k8s_namespace, seed=1)
    result = run_burst(k8s_cluster.client(), k8s_namespace, pods, nodes)
    assert result.ok, result.summary() + "\n" + extender.log_tail()
    assert result.bound >= 200, result.summary()  # the cards really filled up


def test_sigkill_in_the_middle_loses_nothing_and_gives_nothing_twice(
        k8s_cluster: Any, extender: ExtenderProcess, start_kube_scheduler: Callable[..., Any],
        fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    nodes = _cluster(fake_gpu_nodes)
    name = extender.scheduler_name
    start_kube_scheduler(extender_kube_scheduler_config(extender.url, name))
    pods = fractional_pods(PODS, name, k8s_namespace, seed=2)
    killed_at: list[int] = []

    def kill_once(bound: int, elapsed: float) -> None:
        if not killed_at and bound >= PODS // 3:
            extender.kill()
            killed_at.append(bound)
            extender.start()  # a fresh process: all it knows comes from listing the API

    result = run_burst(k8s_cluster.client(), k8s_namespace, pods, nodes,
                       on_progress=kill_once)
    assert killed_at and killed_at[0] < result.bound, (killed_at, result.summary())
    assert extender.starts == 2
    assert result.ok, result.summary() + "\n" + extender.log_tail()
    assert result.bound >= 200, result.summary()
