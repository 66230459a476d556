"""`UsageSinks` bound to the API: `status.usage` by a merge patch of the GPUDevice's status
subresource (the agent's client names field manager egpu-agent on every write), Events through
the project's recorder (`kube.events`, queued, deduplicated, never blocking the sampler), pods
evicted by UID through the Eviction API (a pod recreated under the same name is not the one
that was over; disruption budgets hold)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from elastic_gpu.agent.usage.monitor import UsageSinks
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.core.usage import CardUsage
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import GPUDEVICES, PODS
from elastic_gpu.kube.sync import SyncKubeClient

COMPONENT = "egpu-agent"


class ApiSinks:
    def __init__(self, client: SyncKubeClient, node: str,
                 recorder: EventRecorder | None = None) -> None:
        """`recorder`: one shared by several nodes' sinks (the sandbox's kwok nodes), run by
        its owner; by default the sinks make their own, run from `start`."""
        self.client = client
        self.node = node
        self._own = recorder is None
        self.recorder = recorder or EventRecorder(client.async_client, COMPONENT, node)
        self._events: Future[None] | None = None

    def start(self) -> None:
        if self._own:
            self._events = self.client.submit(self.recorder.run())

    def stop(self) -> None:
        if self._events is not None:
            self._events.cancel()

    def write(self, index: int, usage: CardUsage) -> None:
        self.client.patch(GPUDEVICES.path(name=gd.object_name(self.node, index),
                                          subresource="status"),
                          {"status": {"usage": gd.usage_status(usage)}})

    def event(self, pod: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        # Pods from a list carry no apiVersion/kind; the Event's involvedObject needs them.
        obj = {**pod, "apiVersion": "v1", "kind": "Pod"}
        self.client.loop.call_soon_threadsafe(self.recorder.record, obj, type_, reason, message)

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        """Evict the pod (the Eviction API: the API server deletes it unless a disruption
        budget forbids it now, 429, which the next period tries again), by UID."""
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if meta.get("uid"):
            body["deleteOptions"] = {"preconditions": {"uid": str(meta["uid"])}}
        self.client.create(PODS.path(namespace, name, "eviction"), body)

    def sinks(self) -> UsageSinks:
        return UsageSinks(self.write, self.event, self.delete_pod)
