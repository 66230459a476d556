"""The kubelet's PodResources API (v1 `List`): which container kubelet gave which devices.

The kubelet serves `v1.PodResourcesLister` on a unix socket
(`/var/lib/kubelet/pod-resources/kubelet.sock`; the DaemonSet mounts that directory read-only)
for monitoring agents, as DCGM exporter reads it. It names, per pod and container, the
device-plugin device IDs of each resource kubelet allocated: its own accounting of our plugins'
devices (whole cards, replicas, MIG instances, share and TFLOPS units). The agent reads it for
what the pods' assignments cannot say (`kubelet_cards`): which card a time-sliced replica pod
got (kubelet's choice of replica IDs is the allocation, the scheduler records none), and, for
every other resource, whether kubelet's accounting agrees with the assignment
(`core.usage.holder_mismatches`).

This module is the I/O (one gRPC call, with a deadline); `kubelet_cards` is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from elastic_gpu.agent.config import DEFAULT_POD_RESOURCES_SOCKET
from elastic_gpu.agent.devices import ResourcePlan
from elastic_gpu.agent.proto import podresources_pb2, podresources_pb2_grpc
from elastic_gpu.core.usage import ContainerRef

DEFAULT_SOCKET = DEFAULT_POD_RESOURCES_SOCKET
#: A `List` answers from kubelet's memory; longer than this is a kubelet in trouble.
LIST_TIMEOUT_S = 5.0


class PodResourcesError(RuntimeError):
    """The kubelet's PodResources API did not answer (no socket, refused, timed out)."""


@dataclass(frozen=True)
class KubeletDevices:
    """Devices of one resource kubelet allocated to one container."""

    ref: ContainerRef
    resource: str
    device_ids: tuple[str, ...]


def list_devices(socket: Path | str = DEFAULT_SOCKET, timeout_s: float = LIST_TIMEOUT_S
                 ) -> list[KubeletDevices]:
    """Every container's devices, as kubelet's `List` answers now (`PodResourcesError` when
    it does not)."""
    path = Path(socket)
    if not path.is_socket():
        raise PodResourcesError(f"no kubelet PodResources socket at {path}")
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            answer = podresources_pb2_grpc.PodResourcesListerStub(channel).List(
                podresources_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as err:
        code = err.code() if isinstance(err, grpc.Call) else None
        detail = err.details() if isinstance(err, grpc.Call) else str(err)
        raise PodResourcesError(f"kubelet PodResources List at {path}: {code}: {detail}"
                                ) from None
    # kubelet sends one entry per device when it knows the device's topology (v1.36: one per
    # NUMA group): the entries of one container and resource are one allocation.
    merged: dict[tuple[ContainerRef, str], list[str]] = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            ref = ContainerRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if devices.device_ids:
                    merged.setdefault((ref, devices.resource_name), []).extend(
                        devices.device_ids)
    return [KubeletDevices(ref, resource, tuple(ids)) for (ref, resource), ids in merged.items()]


def kubelet_cards(devices: Iterable[KubeletDevices], plans: Sequence[ResourcePlan]
                  ) -> dict[int, set[ContainerRef]]:
    """{logical card index: the containers kubelet gave a device of it}, for this agent's
    resources only (other plugins' devices and IDs no plan has are left out). Pure."""
    units: Mapping[str, Mapping[str, int]] = {
        plan.resource: {unit.id: unit.card for unit in plan.devices} for plan in plans}
    out: dict[int, set[ContainerRef]] = {}
    for item in devices:
        ids = units.get(item.resource)
        if ids is None:
            continue
        for device in item.device_ids:
            card = ids.get(device)
            if card is not None:
                out.setdefault(card, set()).add(item.ref)
    return out
