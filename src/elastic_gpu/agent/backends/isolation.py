"""How a backend's cards keep a container within its share: the settings a container needs.

The scheduler writes a share (compute in milli-cards, memory in MiB); something on the node
must hold the container to it. That something is a provider, chosen per node in the agent
config (`sharing.mode`): CUDA MPS (`CudaMps`), HAMi-core (`backends.hami_core.HamiCore`), or
none (`accounting`: shares are only counted, EGPU_ISOLATION=accounting-only). A backend names
the provider its cards support for the configured mode (`Backend.isolation`), and the grant
(agent/grant.py) asks it for the environment and mounts, knowing nothing of any vendor. A
provider may be unable to hold a container right now (its daemon is down, its library is
missing): `refusal` says why, and Allocate is refused rather than handing out a share that
nothing enforces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from elastic_gpu.agent.backends.isolation_values import (
    IsolationError,
    IsolationSettings,
    MountSpec,
    ShareLimit,
)
from elastic_gpu.agent.config import SharingConfig, SharingMode
from elastic_gpu.core.resources import MILLI_PER_CARD, MILLI_PER_PERCENT

__all__ = ["CudaMps", "Gated", "Isolation", "IsolationError", "IsolationSettings", "MountSpec",
           "ShareLimit", "cuda_mps_isolation", "nvidia_isolation"]


class Isolation(Protocol):
    @property
    def name(self) -> str:
        """What the container is told (EGPU_ISOLATION and the isolation annotation)."""
        ...

    def settings(self, limits: Sequence[ShareLimit]) -> IsolationSettings:
        """The environment and mounts that hold a container to `limits` (one per granted card,
        in the grant's order); IsolationError when it cannot."""
        ...

    def refusal(self, uuids: Sequence[str]) -> str | None:
        """Why a container on these physical chips cannot be held now (a daemon down, a
        library missing), or None."""
        ...


class CudaMps:
    """NVIDIA's CUDA MPS: the MPS server enforces each client's limits, which a container
    passes as CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (compute, one value for the client) and
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (`<ordinal>=<MiB>M` per visible device), with the MPS
    pipe directory mounted.

    `per_card`: the agent runs one control daemon per card (agent/mps_supervisor.py) with the
    pipe directory `<pipe_directory>/<chip uuid>`; a container gets its card's, mounted where
    one node-wide daemon's would be (`pipe_directory`), so the environment is the same. An
    MPS client talks to one daemon, so a container spanning several chips gets no MPS when
    all of them are whole (they are its alone: "exclusive") and is refused when any is a
    share."""

    def __init__(self, pipe_directory: str, per_card: bool = False,
                 shm_directory: str | None = None) -> None:
        self.pipe_directory = pipe_directory
        self.per_card = per_card
        #: the daemons' /dev/shm on the host, given to each client as its /dev/shm (per-card)
        self.shm_directory = shm_directory

    @property
    def name(self) -> str:
        return "mps"

    def refusal(self, uuids: Sequence[str]) -> str | None:
        return None

    def card_pipe_directory(self, uuid: str) -> str:
        return f"{self.pipe_directory.rstrip('/')}/{uuid}"

    def settings(self, limits: Sequence[ShareLimit]) -> IsolationSettings:
        pipe = self.pipe_directory
        host = pipe
        if self.per_card:
            chips = [uuid for limit in limits for uuid in limit.uuids]
            if len(chips) != 1:
                if all(limit.milli >= MILLI_PER_CARD for limit in limits):
                    return IsolationSettings(mode="exclusive")
                raise IsolationError(
                    f"a share spanning {len(chips)} chips cannot be held by per-card MPS "
                    "daemons (an MPS client connects to one daemon)")
            host = self.card_pipe_directory(chips[0])
        envs = {"CUDA_MPS_PIPE_DIRECTORY": pipe}
        # One thread percentage per MPS client: the smallest share bounds every card; all of
        # the card (100, as for whole cards) when the container asked no compute (a
        # memory-only share: its `milli` is only what the ledger bills).
        percent = min((max(limit.milli, MILLI_PER_PERCENT) // MILLI_PER_PERCENT
                       for limit in limits if limit.limit_compute),
                      default=MILLI_PER_CARD // MILLI_PER_PERCENT)
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
        mounts = [MountSpec(pipe, host)]
        if self.per_card and self.shm_directory:
            mounts.append(MountSpec("/dev/shm", self.shm_directory))
        return IsolationSettings(envs, tuple(mounts))


class Gated:
    """A provider whose containers are refused while `gate` names a reason (e.g. the MPS
    supervisor: the card's daemon is down)."""

    def __init__(self, inner: Isolation, gate: Callable[[Sequence[str]], str | None]) -> None:
        self.inner = inner
        self.gate = gate

    @property
    def name(self) -> str:
        return self.inner.name

    def refusal(self, uuids: Sequence[str]) -> str | None:
        return self.gate(uuids) or self.inner.refusal(uuids)

    def settings(self, limits: Sequence[ShareLimit]) -> IsolationSettings:
        return self.inner.settings(limits)


def nvidia_isolation(sharing: SharingConfig) -> Isolation | None:
    """NVIDIA cards' isolation for a sharing config: CUDA MPS in `mps` mode, HAMi-core in
    `hami-core` mode, none in `accounting` mode."""
    if sharing.mode is SharingMode.MPS:
        daemon = sharing.mps.daemon
        return CudaMps(sharing.mps.pipeDirectory, per_card=daemon is not None,
                       shm_directory=daemon.shmDirectory if daemon is not None else None)
    if sharing.mode is SharingMode.HAMI_CORE:
        from elastic_gpu.agent.backends.hami_core import HamiCore

        return HamiCore(sharing.hamiCore)
    return None


#: The name this function had before HAMi-core (kept for callers of the old name).
cuda_mps_isolation = nvidia_isolation
