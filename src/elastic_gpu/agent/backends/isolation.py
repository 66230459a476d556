"""How a backend's cards keep a container within its share: the settings a container needs.

The scheduler writes a share (compute in milli-cards, memory in MiB); something on the node
must hold the container to it. That something is the vendor's: CUDA MPS for NVIDIA cards,
another mechanism (or none) for another vendor's. So a backend names its `Isolation` for the
configured sharing mode (`Backend.isolation`), and the grant (agent/grant.py) asks it for the
environment and mounts, knowing nothing of any vendor. `None` means shares are only
accounted: nothing on the node enforces them (EGPU_ISOLATION=accounting-only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from elastic_gpu.agent.config import SharingConfig, SharingMode
from elastic_gpu.core.resources import MILLI_PER_PERCENT


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


@dataclass(frozen=True)
class IsolationSettings:
    """What a container needs for its limits to be enforced."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[MountSpec, ...] = ()


class Isolation(Protocol):
    @property
    def name(self) -> str:
        """What the container is told (EGPU_ISOLATION and the isolation annotation)."""
        ...

    def settings(self, limits: Sequence[ShareLimit]) -> IsolationSettings:
        """The environment and mounts that hold a container to `limits` (one per granted card,
        in the grant's order)."""
        ...


class CudaMps:
    """NVIDIA's CUDA MPS: the MPS server enforces each client's limits, which a container
    passes as CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (compute, one value for the client) and
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (`<ordinal>=<MiB>M` per visible device), with the MPS
    pipe directory mounted."""

    def __init__(self, pipe_directory: str) -> None:
        self.pipe_directory = pipe_directory

    @property
    def name(self) -> str:
        return "mps"

    def settings(self, limits: Sequence[ShareLimit]) -> IsolationSettings:
        pipe = self.pipe_directory
        envs = {"CUDA_MPS_PIPE_DIRECTORY": pipe}
        # One thread percentage per MPS client: the smallest share bounds every card.
        percent = min(max(limit.milli, MILLI_PER_PERCENT) for limit in limits) // MILLI_PER_PERCENT
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
        memory = []
        ordinal = 0
        for limit in limits:
            for _ in range(limit.devices):
                if limit.memory_mib:
                    memory.append(f"{ordinal}={limit.memory_mib // limit.devices}M")
                ordinal += 1
        if memory:
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(memory)
        return IsolationSettings(envs, (MountSpec(pipe, pipe),))


def cuda_mps_isolation(sharing: SharingConfig) -> Isolation | None:
    """NVIDIA cards' isolation for a sharing config: CUDA MPS in `mps` mode, none otherwise."""
    if sharing.mode is SharingMode.MPS:
        return CudaMps(sharing.mps.pipeDirectory)
    return None
