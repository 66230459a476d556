"""The node mode: how a node's cards reach the cluster, the agent's one seam between them.

A node is in one mode. `deviceplugin.DevicePluginNode` publishes GPUDevice objects for the
scheduler extender and serves one kubelet device plugin per advertised resource;
`dra.node.DraNode` publishes ResourceSlices and serves the kubelet's DRA plugin. What a node
is (backends, devices, grant, isolation, usage, pods, accounting) is shared by both and knows
neither; `agent.runtime` picks the mode from the config once and drives it only through this
protocol, in this order: `start` (refuse the wrong node, publish), `serve`, then any number of
`cards_changed`, `reasons_changed` and `sync`, and `stop`. (The scheduler's side of the same
seam is `core.nodemode`.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from elastic_gpu.agent.accounting import CardUse
from elastic_gpu.agent.miglayout import CardFence, HeldOn
from elastic_gpu.agent.usage.sinks import ApiSinks


class NodeModeError(RuntimeError):
    """The agent's mode cannot run on this node (the message says what to change)."""


class NodeMode(Protocol):
    """What the agent's runtime asks of a node mode."""

    def capacity(self) -> tuple[Mapping[str, str], Mapping[str, str]]:
        """(capacity, allocatable): the GPU names this mode advertises in the Node's status,
        as the cards are now (`agent.node_status` adds the quota's accounting names)."""
        ...

    def start(self) -> None:
        """Raise NodeModeError if the Node belongs to the other mode's node group; then
        publish the cards (before anything is served)."""
        ...

    def serve(self) -> None:
        """Serve kubelet's plugin(s) (after isolation is up: the first grant finds it)."""
        ...

    def cards_changed(self) -> None:
        """A card's health changed: publish the cards and the Node's capacity again."""
        ...

    def reasons_changed(self) -> None:
        """Only why a card is unhealthy changed (an MPS daemon went or came back)."""
        ...

    @property
    def applies_mig_layouts(self) -> bool:
        """Whether this mode re-advertises a card whose MIG layout the agent changed
        (`layout_changed`), so the agent may run its MIG applier (`agent.miglayout`)."""
        ...

    def layout_changed(self) -> None:
        """A card's MIG layout changed (the runtime rediscovered the cards): serve the
        resources the cards now back (`nvidia.com/mig-*`) and publish them again."""
        ...

    def mig_seam(self) -> tuple[CardFence | None, HeldOn | None]:
        """Where the MIG applier keeps a card's fence and how it reads the card's holders on
        this mode's node (None, None: the GPUDevice's `status.fence` and the pods'
        assignments, `agent.miglayout`'s defaults)."""
        ...

    def sync(self) -> dict[int, CardUse]:
        """The periodic re-assertion (a kubelet restart zeroes extended resources, someone
        may delete an object); returns what the pods use per card where the mode writes it."""
        ...

    def outcomes(self) -> Counter[tuple[str, str]]:
        """Grant outcomes so far (`elasticgpu_agent_allocations_total`)."""
        ...

    def holdings(self, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The node's pods as the shared readers count what they hold (the held metrics,
        observed usage's attribution and drift): each holding pod with its assignment. A
        device-plugin node's pods carry the scheduler's; a DRA node gives its claim pods the
        assignment their prepared claims amount to, in memory only (`agent.dra.holdings`)."""
        ...

    def usage_sinks(self) -> ApiSinks | None:
        """Where observed usage is written besides metrics (None: metrics only)."""
        ...

    def stop(self) -> None:
        ...
