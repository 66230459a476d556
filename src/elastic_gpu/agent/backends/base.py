"""The one small interface every GPU vendor backend implements (HAMi-style vendor device).

A backend knows the physical devices of one node and nothing about Kubernetes: it discovers
them as core `Card`s (a chip of a multi-chip board is a Card whose `board` is set), reports
health changes, and says which host device files a container needs for a card. Everything
else (boards, replicas, MIG strategies, kubelet, the API) is built on top, identically for
every backend, so the fake backend exercises the same code as NVML.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from elastic_gpu.agent.backends.isolation import Isolation
from elastic_gpu.agent.config import SharingConfig
from elastic_gpu.core.mig.apply import CardChange
from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.usage import ContainerRef


class BackendError(RuntimeError):
    """The backend cannot serve: no driver, a lost GPU during discovery, a bad inventory."""


@dataclass(frozen=True)
class HealthEvent:
    """A physical card (by UUID) changed health; `reason` says why, for people."""

    uuid: str
    health: Health
    reason: str


@dataclass(frozen=True)
class ProcessSample:
    """A process with a context on a card: its memory there and, where the backend samples it,
    its share of the card's SM time (percent). `owner` is set only by a backend that knows the
    holder without the host's processes (the fake usage model on a node with no real
    containers); otherwise the agent maps `pid` through its cgroup."""

    pid: int
    memory_mib: int
    sm_percent: int | None = None
    owner: ContainerRef | None = None


@dataclass(frozen=True)
class MigSample:
    """One MIG instance of a card (by its UUID) sampled: memory in use and its processes.
    No utilisation: NVML has none per MIG instance (`nvmlDeviceGetUtilizationRates` and
    per-process samples are not supported on MIG devices)."""

    uuid: str
    used_mib: int
    processes: tuple[ProcessSample, ...] = ()


@dataclass(frozen=True)
class CardSample:
    """One physical card (by UUID) sampled: memory in use, SM utilisation, its processes
    (on a MIG card the parent's list holds every instance's), and each MIG instance's own
    figures."""

    uuid: str
    used_mib: int
    sm_percent: int
    processes: tuple[ProcessSample, ...] = ()
    mig: tuple[MigSample, ...] = ()


@dataclass(frozen=True)
class Holder:
    """A container the node's ledger says holds a card, as the agent tells `Backend.sample`.
    Real backends ignore holders (they sample the hardware); the fake backend's usage model
    reads the pod's annotations and the container's runtime IDs from here."""

    card_uuid: str
    ref: ContainerRef
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: The container's runtime IDs (containerStatuses[].containerID without the scheme).
    container_ids: tuple[str, ...] = ()
    #: The MIG instance it holds on the card (None: the card or a share of it).
    mig_uuid: str | None = None


class Backend(Protocol):
    @property
    def name(self) -> str:
        """Short name for logs and the inventory ("nvml", "fake")."""
        ...

    @property
    def visible_devices_env(self) -> str:
        """The environment variable the container runtime hook reads visible devices from."""
        ...

    def discover(self) -> tuple[Card, ...]:
        """All physical cards/chips, indexes as the driver numbers them; raises BackendError."""
        ...

    def wait_health(self, timeout_s: float) -> list[HealthEvent]:
        """Block up to `timeout_s` for health changes; [] when nothing happened."""
        ...

    def device_nodes(self, card: Card) -> tuple[str, ...]:
        """Host device files that give a container `card` (e.g. /dev/nvidia3)."""
        ...

    def control_nodes(self) -> tuple[str, ...]:
        """Host device files every GPU container needs (e.g. /dev/nvidiactl)."""
        ...

    def isolation(self, sharing: SharingConfig) -> Isolation | None:
        """What enforces shares on this backend's cards in `sharing.mode`; None when nothing
        does (shares are only accounted)."""
        ...

    def sample(self, holders: Sequence[Holder] = ()) -> tuple[CardSample, ...]:
        """Every physical card's current use; a card that cannot be sampled is left out
        (never a guess). Raises BackendError when nothing can be sampled."""
        ...

    def apply_mig_step(self, card_uuid: str, step: CardChange) -> tuple[MigInstance, ...]:
        """Carry out one step of a card's MIG layout (`core.mig.apply.next_step`: create one
        instance at its placement, destroy one, or set the card's MIG mode, which may stay
        pending a GPU reset: `discover` then reads it in the card's `mig_mode`) and return the
        card's instances after it.
        The agent has checked holders and the fence; the backend refuses what the card
        refuses (BackendError with the driver's reason), and never forces a device in use."""
        ...

    def close(self) -> None:
        ...
