"""`UsageSinks` bound to the API: `status.usage` by a merge patch of the GPUDevice's status
subresource (the agent's client names field manager egpu-agent on every write), Events through
the project's recorder (`kube.events`, queued, deduplicated, never blocking the sampler), pods
deleted by UID (a pod recreated under the same name is not the one that was over)."""

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
    def __init__(self, client: SyncKubeClient, node: str) -> None:
        self.client = client
        self.node = node
        self.recorder = EventRecorder(client.async_client, COMPONENT, node)
        self._events: Future[None] | None = None

    def start(self) -> None:
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
        meta = pod.get("metadata") or {}
        self.client.delete(PODS.path(str(meta.get("namespace")), str(meta.get("name"))),
                           uid=str(meta.get("uid") or "") or None)

    def sinks(self) -> UsageSinks:
        return UsageSinks(self.write, self.event, self.delete_pod)
