"""The kubelet's side of the device-plugin protocol, for tests and benchmarks (not a kubelet).

It does what kubelet's device manager does on the wire, over real unix sockets: serves
`Registration` on <dir>/kubelet.sock; inside Register it dials the plugin's endpoint back and
calls GetDevicePluginOptions before answering (so a plugin that blocks its own serving while
registering deadlocks here as it would with kubelet); then it follows ListAndWatch and keeps
every device list it received. `restart()` behaves like a kubelet restart: every socket in
the directory is deleted and kubelet.sock is served anew.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from elastic_gpu.agent.proto import api_pb2, api_pb2_grpc

API_VERSION = "v1beta1"


@dataclass
class Registration:
    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    at: float


@dataclass
class PluginLink:
    """kubelet's connection to one registered plugin."""

    channel: grpc.Channel
    stub: api_pb2_grpc.DevicePluginStub
    updates: list[dict[str, str]] = field(default_factory=list)


class KubeletDouble(api_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[Registration] = []
        self.plugins: dict[str, PluginLink] = {}
        self._cond = threading.Condition()
        self._server: Any = None

    # -- kubelet.sock --------------------------------------------------------------------

    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet"))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        server.start()
        self._server = server

    def stop(self) -> None:
        with self._cond:
            links = list(self.plugins.values())
            self.plugins.clear()
        for link in links:
            link.channel.close()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None

    def restart(self) -> None:
        """A kubelet restart: stop, delete every socket in the directory, serve again."""
        self.stop()
        for path in self.plugin_dir.iterdir():
            if path.is_socket() or path.suffix == ".sock":
                path.unlink()
        self.start()

    def Register(self, request: api_pb2.RegisterRequest, context: Any) -> api_pb2.Empty:
        if request.version != API_VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}")
        if "/" in request.endpoint:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "endpoint must be a file name")
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
        except grpc.RpcError as err:
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial plugin back: {err}")
        link = PluginLink(channel, stub)
        with self._cond:
            old = self.plugins.get(request.resource_name)
            self.plugins[request.resource_name] = link
            self.registrations.append(Registration(request.resource_name, request.endpoint,
                                                   options, time.monotonic()))
            self._cond.notify_all()
        if old is not None:
            old.channel.close()
        threading.Thread(target=self._watch, args=(request.resource_name, link),
                         daemon=True).start()
        return api_pb2.Empty()

    def _watch(self, resource: str, link: PluginLink) -> None:
        try:
            for response in link.stub.ListAndWatch(api_pb2.Empty()):
                with self._cond:
                    link.updates.append({d.ID: d.health for d in response.devices})
                    self._cond.notify_all()
        except (grpc.RpcError, ValueError):
            return  # plugin or channel (closed: ValueError) went away; a new registration starts a new watch

    # -- what tests look at ----------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout_s)

    def devices(self, resource: str) -> dict[str, str]:
        with self._cond:
            link = self.plugins.get(resource)
            return dict(link.updates[-1]) if link and link.updates else {}

    def registered(self, resource: str) -> bool:
        with self._cond:
            return resource in self.plugins

    def allocate(self, resource: str, ids: Sequence[Sequence[str]]) -> api_pb2.AllocateResponse:
        stub = self.plugins[resource].stub
        request = api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=list(group)) for group in ids])
        response: api_pb2.AllocateResponse = stub.Allocate(request, timeout=10)
        return response

    def preferred(self, resource: str, available: Sequence[str], must: Sequence[str],
                  size: int) -> list[str]:
        stub = self.plugins[resource].stub
        response = stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
            container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), must_include_deviceIDs=list(must),
                allocation_size=size)]), timeout=10)
        return list(response.container_responses[0].deviceIDs)
