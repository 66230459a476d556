"""One kubelet device plugin per resource: a gRPC server on a unix socket, and its registration.

Threads, not asyncio: grpc's sync server runs each RPC on a pool thread, so a long-lived
ListAndWatch stream never stalls Allocate, and Register (a blocking call to kubelet made from
the manager's thread, during which kubelet dials back and calls GetDevicePluginOptions) is
answered by the pool while the manager waits. The Kubernetes client used by Allocate is
synchronous too, so no event loop has to be bridged.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from elastic_gpu.agent.deviceplugin.allocator import Allocator
from elastic_gpu.agent.devices import ResourcePlan, preferred, unit_health
from elastic_gpu.agent.grant import Grant
from elastic_gpu.agent.matching import AllocateError
from elastic_gpu.agent.proto import api_pb2, api_pb2_grpc
from elastic_gpu.agent.state import NodeState

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
#: How often a ListAndWatch stream checks whether its server is stopping.
STREAM_TICK_S = 0.5


def socket_name(resource: str) -> str:
    """`elasticgpu.io/gpu-core` -> `egpu-elasticgpu.io_gpu-core.sock` (a file name only)."""
    return "egpu-" + re.sub(r"[^A-Za-z0-9.-]", "_", resource) + ".sock"


def grant_to_proto(grant: Grant) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=grant.envs,
        mounts=[api_pb2.Mount(container_path=m.container_path, host_path=m.host_path,
                              read_only=m.read_only) for m in grant.mounts],
        devices=[api_pb2.DeviceSpec(container_path=d.container_path, host_path=d.host_path,
                                    permissions=d.permissions) for d in grant.devices],
        annotations=grant.annotations,
    )


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, plan: ResourcePlan, state: NodeState, allocator: Allocator,
                 stopping: threading.Event) -> None:
        self.plan = plan
        self.state = state
        self.allocator = allocator
        self.stopping = stopping
        self.units = plan.by_id()

    def devices(self) -> list[api_pb2.Device]:
        health = self.state.health()
        out = []
        for unit in self.plan.devices:
            topology = (api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=unit.numa_node)])
                        if unit.numa_node is not None else None)
            out.append(api_pb2.Device(ID=unit.id, health=unit_health(unit, health).value,
                                      topology=topology))
        return out

    def GetDevicePluginOptions(self, request: api_pb2.Empty,
                               context: Any) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False,
                                           get_preferred_allocation_available=True)

    def ListAndWatch(self, request: api_pb2.Empty,
                     context: Any) -> Iterator[api_pb2.ListAndWatchResponse]:
        seen = -1
        while not self.stopping.is_set() and context.is_active():
            version = self.state.wait_change(seen, STREAM_TICK_S) if seen >= 0 else \
                self.state.version
            if version != seen:
                seen = version
                yield api_pb2.ListAndWatchResponse(devices=self.devices())

    def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest,
                               context: Any) -> api_pb2.PreferredAllocationResponse:
        cards = {index: lc.card for index, lc in self.state.cards().items()}
        responses = []
        for req in request.container_requests:
            available = list(req.available_deviceIDs)
            must = list(req.must_include_deviceIDs)
            size = int(req.allocation_size)
            assigned = None if must else self.allocator.assigned_devices(self.plan, available,
                                                                        size)
            ids = assigned or preferred(available, must, size, self.units, cards)
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        responses = []
        for req in request.container_requests:
            try:
                grant = self.allocator.allocate(self.plan, list(req.devices_ids))
            except AllocateError as err:
                log.warning("Allocate refused: %s", err)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
                raise  # abort raises; this keeps type checkers aware
            responses.append(grant_to_proto(grant))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest,
                          context: Any) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """The gRPC server of one resource, restartable when kubelet wipes its socket."""

    def __init__(self, plan: ResourcePlan, state: NodeState, allocator: Allocator,
                 plugin_dir: Path, workers: int = 8) -> None:
        self.plan = plan
        self.state = state
        self.allocator = allocator
        self.plugin_dir = plugin_dir
        self.workers = workers
        self.socket = plugin_dir / socket_name(plan.resource)
        self._server: Any = None
        self._stopping = threading.Event()
        self._inode: int | None = None
        self.registered = False

    @property
    def resource(self) -> str:
        return self.plan.resource

    def start(self) -> None:
        self.stop()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        if self.socket.exists() or self.socket.is_symlink():
            self.socket.unlink()  # a stale socket from a previous run would refuse the bind
        self._stopping = threading.Event()
        server = grpc.server(ThreadPoolExecutor(max_workers=self.workers,
                                                thread_name_prefix=f"dp-{self.plan.kind.value}"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            DevicePluginService(self.plan, self.state, self.allocator, self._stopping), server)
        if server.add_insecure_port(f"unix://{self.socket}") == 0:
            raise OSError(f"cannot listen on {self.socket}")
        server.start()
        self._server = server
        self._inode = os.stat(self.socket).st_ino
        self.registered = False
        log.info("serving %s on %s (%d devices)", self.resource, self.socket,
                 len(self.plan.devices))

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()
        self._server.stop(grace=None).wait(5)
        self._server = None
        self.registered = False

    def socket_intact(self) -> bool:
        """False once kubelet (re)started and removed our socket."""
        try:
            return os.stat(self.socket).st_ino == self._inode
        except FileNotFoundError:
            return False

    def register(self, timeout_s: float = 5.0) -> None:
        kubelet = self.plugin_dir / KUBELET_SOCKET
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=self.socket.name, resource_name=self.resource,
                    options=api_pb2.DevicePluginOptions(pre_start_required=False,
                                                        get_preferred_allocation_available=True)),
                timeout=timeout_s)
        self.registered = True
        log.info("registered %s with kubelet", self.resource)
