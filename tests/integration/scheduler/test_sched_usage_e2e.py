"""Observed usage in placement on a real control plane (issue 28): the extender beside the real
kube-scheduler and kwok nodes, each card's usage written into its GPUDevice `status.usage` as
the node's agent writes it (the wire contract; the agent's sampling is tested on its side).

- A card with out-of-band memory turns away a share that would overflow it, and the pod's
  Unschedulable condition names the out-of-band memory.
- With `loadAware: true`, new shares go to the cool card of a node and the cool node of two.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import (
    create_pods,
    unschedulable_reason,
    wait_bound,
    wait_extender_knows,
)
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config, pod_manifest
from elastic_gpu.api.gpudevice import object_name, usage_status
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.usage import CardUsage
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

GIB = 1024
CORE, MEMORY = "elasticgpu.io/gpu-core", "elasticgpu.io/gpu-memory"


@pytest.fixture
def start(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path
          ) -> Iterator[Callable[[dict[str, Any]], ExtenderProcess]]:
    started: list[ExtenderProcess] = []

    def run(config: dict[str, Any]) -> ExtenderProcess:
        (port,) = free_ports(1)
        process = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log",
                                  config=config)
        process.start()
        started.append(process)
        start_kube_scheduler(extender_kube_scheduler_config(
            process.url, process.scheduler_name,
            prioritize=config.get("filterResult") != "best"))
        return process

    yield run
    for process in started:
        process.stop()


def observe(cluster: Any, node: str, index: int, usage: CardUsage) -> None:
    """Write the card's `status.usage` as its agent does."""
    cluster.kubectl("patch", "gpudevice", object_name(node, index), "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"usage": usage_status(usage)}}))


def probe(extender: ExtenderProcess, limits: dict[str, str], nodes: list[str]) -> dict[str, Any]:
    """The extender's own /filter answer for a pod of these limits (not created)."""
    pod = pod_manifest("probe", uid="probe-uid", limits=limits)
    body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
    request = urllib.request.Request(f"{extender.url}/filter", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def wait_refused(extender: ExtenderProcess, limits: dict[str, str], node: str,
                 needle: str, timeout_s: float = 30.0) -> str:
    """Until the extender refuses such a pod on `node` with a reason containing `needle` (it
    has read the usage written before)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = probe(extender, limits, [node])
        reason = str((answer.get("FailedNodes") or {}).get(node, ""))
        if needle in reason:
            return reason
        assert time.monotonic() < deadline, f"{node}: {answer}\n{extender.log_tail()}"
        time.sleep(0.2)


def cards_of(pod: dict[str, Any]) -> list[int]:
    assignment = Assignment.from_json(pod["metadata"]["annotations"][ann.ASSIGNMENT])
    return [s.index for s in assignment.shares()]


def test_a_card_with_out_of_band_memory_refuses_a_share_that_would_overflow_it(
        k8s_cluster: Any, start: Callable[[dict[str, Any]], ExtenderProcess],
        k8s_namespace: str, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    (node,) = fake_gpu_nodes(1, gpus=1, gpu_model="A100", gpu_memory_mib=80 * GIB)
    extender = start({})
    wait_extender_knows(extender.url, [node], 1)
    observe(k8s_cluster, node, 0, CardUsage(60 * GIB, 60 * GIB, 30))
    big = {CORE: "20", MEMORY: str(30 * GIB)}
    wait_refused(extender, big, node, "out of band")
    client = k8s_cluster.client()
    create_pods(client, [
        pod_manifest("big", k8s_namespace, limits=big, scheduler_name=extender.scheduler_name),
        pod_manifest("small", k8s_namespace, limits={CORE: "20", MEMORY: str(10 * GIB)},
                     scheduler_name=extender.scheduler_name)])
    reason = unschedulable_reason(client, k8s_namespace, "big")
    assert "61440 MiB of its 81920 MiB used out of band" in reason, reason
    # 20480 MiB left, or 10240 once "small" holds its share (the pod is tried again)
    assert re.search(r"leaving (20480|10240) MiB; container main asks 30720 MiB", reason), reason
    assert wait_bound(client, k8s_namespace, ["small"])["small"]["spec"]["nodeName"] == node


def pinned(name: str, namespace: str, extender: ExtenderProcess, group: str,
           percent: int) -> dict[str, Any]:
    pod = pod_manifest(name, namespace, limits={CORE: str(percent)},
                       scheduler_name=extender.scheduler_name)
    pod["spec"]["nodeSelector"] = {"test.elasticgpu.io/group": group}
    return pod


def test_load_aware_moves_new_shares_off_the_hot_cards(
        k8s_cluster: Any, start: Callable[[dict[str, Any]], ExtenderProcess],
        k8s_namespace: str, fake_gpu_nodes: Callable[..., list[str]]) -> None:
    # filterResult best: kube-scheduler binds the engine's node (with "all" it picks among the
    # nodes whose scores tie itself; the card preference holds either way)
    extender = start({"loadAware": True, "filterResult": "best", "nodePolicy": "binpack"})
    group = unique_name("load")
    (pair,) = fake_gpu_nodes(1, gpus=2, gpu_model="A100", gpu_memory_mib=80 * GIB,
                             labels={"test.elasticgpu.io/group": f"{group}-pair"})
    hot, cool = fake_gpu_nodes(2, gpus=1, gpu_model="A100", gpu_memory_mib=80 * GIB,
                               labels={"test.elasticgpu.io/group": f"{group}-two"})
    (marker,) = fake_gpu_nodes(1, gpus=1, gpu_model="A100", gpu_memory_mib=80 * GIB)
    wait_extender_knows(extender.url, [pair, hot, cool, marker], 1)
    observe(k8s_cluster, pair, 0, CardUsage(8 * GIB, 0, 95))
    observe(k8s_cluster, pair, 1, CardUsage(1 * GIB, 0, 4))
    observe(k8s_cluster, hot, 0, CardUsage(8 * GIB, 0, 90))
    observe(k8s_cluster, cool, 0, CardUsage(1 * GIB, 0, 10))
    # written last: once the extender refuses for it, it has read the samples before it
    observe(k8s_cluster, marker, 0, CardUsage(80 * GIB, 80 * GIB, 0))
    wait_refused(extender, {CORE: "10", MEMORY: "1024"}, marker, "out of band")
    client = k8s_cluster.client()
    create_pods(client, [pinned("on-pair", k8s_namespace, extender, f"{group}-pair", 30),
                         pinned("on-two", k8s_namespace, extender, f"{group}-two", 30)])
    bound = wait_bound(client, k8s_namespace, ["on-pair", "on-two"])
    assert cards_of(bound["on-pair"]) == [1]  # off the node's hot card 0
    assert bound["on-two"]["spec"]["nodeName"] == cool  # off the hot node
