"""The kubelet's side of the PodResources API (`v1.PodResourcesLister/List`), for unit tests
(not a kubelet: the integration test reads the real kubelet's socket).

It serves, over a real unix socket, what a test sets: per (namespace, pod, container) the
device IDs of each resource, as kubelet's device manager accounts them, one entry per device
as the real kubelet sends devices it knows the topology of. `hang` makes `List`
wait past any caller's deadline, as a kubelet in trouble would.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from elastic_gpu.agent.proto import podresources_pb2, podresources_pb2_grpc

#: {(namespace, pod, container): {resource: device IDs}}
Allocations = Mapping[tuple[str, str, str], Mapping[str, Sequence[str]]]


class PodResourcesDouble(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.allocations: Allocations = {}
        self.hang = threading.Event()
        self.calls = 0
        self._release = threading.Event()
        self._server: grpc.Server | None = None

    def start(self) -> None:
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def List(self, request: podresources_pb2.ListPodResourcesRequest, context: Any
             ) -> podresources_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.hang.is_set():
            self._release.wait(30)
        pods: dict[tuple[str, str], podresources_pb2.PodResources] = {}
        for (namespace, pod, container), resources in sorted(self.allocations.items()):
            entry = pods.setdefault((namespace, pod), podresources_pb2.PodResources(
                name=pod, namespace=namespace))
            entry.containers.append(podresources_pb2.ContainerResources(
                name=container, devices=[
                    podresources_pb2.ContainerDevices(resource_name=name, device_ids=[one])
                    for name, ids in sorted(resources.items()) for one in ids]))
        return podresources_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))
