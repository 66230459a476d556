"""The DRA plugin's device health stream (`v1alpha1.DRAResourceHealth/NodeWatchResources`):
kubelet shows the health of a pod's allocated devices in its status
(`allocatedResourcesStatus`, ResourceHealthStatus, beta in 1.36).

kubelet opens the stream on the DRA service socket and, when it is not served, logs an error
and tries again every 5 s. The stream sends every published device (`core.dra.devices` names)
with its card's health as the agent follows it (`agent.state.NodeState`), at once, on each
change, and at least every `RESEND_S`: kubelet marks a device Unknown when no report came
within its `health_check_timeout_seconds`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.agent.proto import dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc
from elastic_gpu.agent.state import NodeState
from elastic_gpu.core.dra.devices import device_table
from elastic_gpu.core.model import Health

#: A report at least this often ...
RESEND_S = 10.0
#: ... and kubelet waits this long for the next before it says Unknown.
HEALTH_TIMEOUT_S = 60
#: How often a stream checks whether its server is stopping.
STREAM_TICK_S = 0.5


@dataclass(frozen=True)
class DeviceHealthRow:
    device: str
    health: Health
    message: str


def device_health(cards: Mapping[int, LogicalCard],
                  reasons: Mapping[int, str]) -> list[DeviceHealthRow]:
    """Each published device's health: its card's (a MIG instance: the worse of its card's
    and its own), with the card's reason when unhealthy. Pure."""
    rows = []
    table = device_table([lc.card for _, lc in sorted(cards.items())])
    for name, ref in sorted(table.items()):
        sick = ref.card.health is Health.UNHEALTHY or (
            ref.mig is not None and ref.mig.health is Health.UNHEALTHY)
        rows.append(DeviceHealthRow(
            name, Health.UNHEALTHY if sick else Health.HEALTHY,
            (reasons.get(ref.card.index) or "unhealthy") if sick else ""))
    return rows


def to_proto(node: str, rows: list[DeviceHealthRow], now: float
             ) -> dra_health_v1alpha1_pb2.NodeWatchResourcesResponse:
    status = dra_health_v1alpha1_pb2
    return status.NodeWatchResourcesResponse(devices=[status.DeviceHealth(
        device=status.DeviceIdentifier(pool_name=node, device_name=row.device),
        health=status.HEALTHY if row.health is Health.HEALTHY else status.UNHEALTHY,
        last_updated_time=int(now), health_check_timeout_seconds=HEALTH_TIMEOUT_S,
        message=row.message) for row in rows])


class DraHealthService(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, node: str, state: NodeState, stopping: threading.Event) -> None:
        self.node = node
        self.state = state
        self.stopping = stopping

    def _report(self) -> dra_health_v1alpha1_pb2.NodeWatchResourcesResponse:
        cards = self.state.cards()
        reasons = {index: self.state.reason(index) for index in cards}
        return to_proto(self.node, device_health(cards, reasons), time.time())

    def NodeWatchResources(self, request: dra_health_v1alpha1_pb2.NodeWatchResourcesRequest,
                           context: Any
                           ) -> Iterator[dra_health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        seen = self.state.version
        sent = time.monotonic()
        yield self._report()
        while not self.stopping.is_set() and context.is_active():
            version = self.state.wait_change(seen, STREAM_TICK_S)
            if version != seen or time.monotonic() - sent >= RESEND_S:
                seen = version
                sent = time.monotonic()
                yield self._report()
