"""The values an isolation provider deals in (`backends.isolation`): a card's limits in, the
environment and mounts a container needs out, and the error of a container it cannot hold.
Apart from the `Isolation` interface so that providers in their own modules
(`backends.hami_core`) and the interface's module that chooses among them import no circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ShareLimit:
    """One granted card as isolation sees it: the compute and memory granted on it and how
    many devices (chips) it shows the container, in the order the container sees them."""

    milli: int
    memory_mib: int
    devices: int = 1
    #: The card's physical chips (UUIDs), in the order the container sees them.
    uuids: tuple[str, ...] = ()
    #: Whether the container asked compute (`core.request.limits_compute`): False for a
    #: memory-only share, whose `milli` is only the 1 % the ledger bills it; a provider then
    #: sets no compute limit on the card (HAMi-core's 0, MPS's 100 %).
    limit_compute: bool = True


@dataclass(frozen=True)
class IsolationSettings:
    """What a container needs for its limits to be enforced."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[MountSpec, ...] = ()
    #: What the container is told instead of the provider's name (e.g. "exclusive" for
    #: whole cards the provider leaves alone); None: the provider's name.
    mode: str | None = None


class IsolationError(RuntimeError):
    """The provider cannot hold this container to its limits: Allocate is refused."""
