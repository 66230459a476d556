"""The API worker against the real API server: feeds, binds, wake-ups, errors, and a worker
restart."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from egpu_testing.scenario import create_pods
from egpu_testing.workbench import pod_manifest
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.wakeup import Wake
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.scheduler.apiworker import WAKEUP_CONDITION
from elastic_gpu.scheduler.handle import BindError
from elastic_gpu.scheduler.worker_link import WorkerLink

pytestmark = pytest.mark.integration


class Recorder:
    """A FeedSink that remembers what arrived."""

    def __init__(self) -> None:
        self.replaces: dict[str, list[list[dict[str, Any]]]] = {}
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.to_wake: list[Wake] = []
        self.wake_results: list[str] = []

    def _replace(self, feed: str, items: list[dict[str, Any]]) -> None:
        self.replaces.setdefault(feed, []).append(items)

    def nodes_replace(self, items: list[dict[str, Any]]) -> None:
        self._replace("nodes", items)

    def devices_replace(self, items: list[dict[str, Any]]) -> None:
        self._replace("gpudevices", items)

    def pods_replace(self, items: list[dict[str, Any]]) -> None:
        self._replace("pods", items)

    def nodes_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append(("nodes", kind, obj))

    def devices_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append(("gpudevices", kind, obj))

    def pods_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append(("pods", kind, obj))

    # the Elastic GPU API's feeds (its CRDs may not be installed: then they replace with [])
    def egpus_replace(self, items: list[dict[str, Any]]) -> None:
        self._replace("elasticgpus", items)

    def egpus_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append(("elasticgpus", kind, obj))

    def claims_replace(self, items: list[dict[str, Any]]) -> None:
        self._replace("elasticgpuclaims", items)

    def claims_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append(("elasticgpuclaims", kind, obj))

    def classes_replace(self, items: list[dict[str, Any]]) -> None:
        self._replace("elasticgpuclasses", items)

    def classes_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append(("elasticgpuclasses", kind, obj))

    # the wake-up side of `app.Feeds`: pods queued by the test, the outcomes of their wake-ups
    def wakeups(self) -> list[Wake]:
        queued, self.to_wake = self.to_wake, []
        return queued

    def wakeup_pending(self) -> bool:
        return bool(self.to_wake)

    def wakeup_result(self, wake: Wake, sent: bool, definite: bool) -> None:
        self.wake_results.append("sent" if sent else "failed" if definite else "unknown")

    def pod_events(self, name: str) -> list[tuple[str, dict[str, Any]]]:
        return [(kind, obj) for feed, kind, obj in self.events
                if feed == "pods" and obj["metadata"]["name"] == name]


async def until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_the_worker_feeds_binds_and_comes_back_after_a_kill(
        k8s_cluster: ControlPlane, fake_gpu_nodes: Callable[..., list[str]],
        k8s_namespace: str) -> None:
    (node,) = fake_gpu_nodes(1, gpus=2)
    client = k8s_cluster.client()
    sink = Recorder()
    link = WorkerLink(k8s_cluster.kubeconfig, sink)
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: all(f in sink.replaces for f in ("nodes", "gpudevices", "pods")))
        assert node in {n["metadata"]["name"] for n in sink.replaces["nodes"][-1]}
        assert sum(d["spec"]["node"] == node for d in sink.replaces["gpudevices"][-1]) == 2

        create_pods(client, [pod_manifest(f"w{i}", k8s_namespace, scheduler_name="nobody",
                                          limits={"nvidia.com/gpu": "1"}) for i in range(2)])
        await until(lambda: bool(sink.pod_events("w0")) and bool(sink.pod_events("w1")))
        pod = await link.get_pod(k8s_namespace, "w0")
        assert pod is not None and "managedFields" not in pod["metadata"]
        uid = pod["metadata"]["uid"]
        assert await link.get_pod(k8s_namespace, "no-such-pod") is None

        # a precondition the API refuses: definite, with the API's code and words
        with pytest.raises(BindError) as refused:
            await link.bind(k8s_namespace, "w0", "not-the-uid", node, None, {})
        assert refused.value.definite and refused.value.code == 409
        assert "not-the-uid" in str(refused.value)

        notes = {ann.ASSIGNED_NODE: node}
        await link.bind(k8s_namespace, "w0", uid, node, int(pod["metadata"]["resourceVersion"]),
                        notes)
        await until(lambda: any(o["spec"].get("nodeName") == node
                                for _, o in sink.pod_events("w0")))
        bound = await link.get_pod(k8s_namespace, "w0")
        assert bound is not None and bound["spec"]["nodeName"] == node
        assert bound["metadata"]["annotations"][ann.ASSIGNED_NODE] == node

        # SIGKILL the worker: the link starts another, which lists everything again
        process = link._process
        assert process is not None and link.starts == 1
        lists_before = len(sink.replaces["pods"])
        os.kill(process.pid, signal.SIGKILL)
        await until(lambda: link.starts == 2 and len(sink.replaces["pods"]) > lists_before)
        relisted = {p["metadata"]["name"]: p for p in sink.replaces["pods"][-1]}
        assert relisted["w0"]["spec"]["nodeName"] == node
        other = await link.get_pod(k8s_namespace, "w1")
        assert other is not None
        await link.bind(k8s_namespace, "w1", other["metadata"]["uid"], node, None, {})
        await until(lambda: any(o["spec"].get("nodeName") == node
                                for _, o in sink.pod_events("w1")))
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert link._process is None
    with pytest.raises(BindError, match="not running"):
        await link.get_pod(k8s_namespace, "w0")


async def test_the_worker_wakes_a_pending_pod_through_its_status(
        k8s_cluster: ControlPlane, k8s_namespace: str) -> None:
    """The wake-up is a strategic-merge patch of pods/status: our condition is added next to
    the others, each wake-up changes the pod, and a pod re-created under the same name (another
    UID) is not woken."""
    client = k8s_cluster.client()
    sink = Recorder()
    link = WorkerLink(k8s_cluster.kubeconfig, sink)
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: "pods" in sink.replaces)
        create_pods(client, [pod_manifest("w", k8s_namespace, scheduler_name="nobody",
                                          limits={"nvidia.com/gpu": "1"})])
        pod = await link.get_pod(k8s_namespace, "w")
        assert pod is not None
        uid, version = pod["metadata"]["uid"], int(pod["metadata"]["resourceVersion"])
        sink.to_wake = [Wake(uid, k8s_namespace, "w", "n1"),
                        Wake("not-the-uid", k8s_namespace, "w", "n1")]
        await until(lambda: len(sink.wake_results) == 2)
        assert sorted(sink.wake_results) == ["failed", "sent"]

        from lightkube.resources.core_v1 import Pod

        def conditions() -> dict[str, Any]:
            status = client.get(Pod, "w", namespace=k8s_namespace).status
            return {c.type: c for c in status.conditions or []}

        first = conditions()[WAKEUP_CONDITION]
        assert first.status == "True" and first.reason == "GPUCapacityFreed"
        assert "node n1" in first.message
        # The patch is done when the wake-up reports "sent"; its watch event may come after.
        await until(lambda: any(int(o["metadata"]["resourceVersion"]) > version
                                for _, o in sink.pod_events("w")))
        sink.to_wake = [Wake(uid, k8s_namespace, "w", "n2")]
        await until(lambda: len(sink.wake_results) == 3)
        again = conditions()[WAKEUP_CONDITION]
        assert again.message != first.message and "node n2" in again.message
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
