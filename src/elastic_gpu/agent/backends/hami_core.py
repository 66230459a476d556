"""HAMi-core as an isolation provider (`sharing.mode: hami-core`).

HAMi-core (github.com/Project-HAMi/HAMi-core) is a library, `libvgpu.so`, that a container
preloads: it intercepts the CUDA driver API and holds the process to the limits in its
environment, as HAMi's and Volcano's device plugins set them:

- `CUDA_DEVICE_MEMORY_LIMIT_<i>`: the memory of the container's i-th visible device, with a
  unit (`4096m`); allocations beyond it fail with out-of-memory.
- `CUDA_DEVICE_SM_LIMIT`: the percent of the device's compute (HAMi-core's time-slicing of
  kernel launches; one value for every device of the container), and for a container on
  several devices (a multi-card share) `CUDA_DEVICE_SM_LIMIT_<i>` per device as well. 0 is
  no limit: a container that asked no compute (a memory-only share) gets 0, as under HAMi.
- `CUDA_DEVICE_MEMORY_SHARED_CACHE`: a file where the container's processes account their
  use together; it lives in a directory of the container's own on the host.

We neither ship nor vendor the library: the operator installs it on the node (docs/agent.md)
and names its path in the config. The agent mounts it read-only and preloads it (LD_PRELOAD,
or /etc/ld.so.preload as HAMi does); the lock directory HAMi-core shares between containers is
mounted too. When the library is missing the container is refused (`refusal`), never given a
share nothing enforces. Not a security boundary: a process that does not load the library
(a static binary, one that unsets LD_PRELOAD with the env preload) is not held.
"""

from __future__ import annotations

import os
import uuid as uuidlib
from collections.abc import Callable, Sequence
from pathlib import Path

from elastic_gpu.agent.backends.isolation_values import (
    IsolationError,
    IsolationSettings,
    MountSpec,
    ShareLimit,
)
from elastic_gpu.agent.config import HamiCoreConfig, Preload
from elastic_gpu.core.resources import MILLI_PER_CARD, MILLI_PER_PERCENT

#: Where the container sees the library, its cache directory and its preload file (HAMi's
#: paths, so images built for HAMi find them where they expect).
CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
CONTAINER_CACHE_DIR = "/usr/local/vgpu/cache"
CONTAINER_CACHE_FILE = f"{CONTAINER_CACHE_DIR}/vgpu.cache"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
#: Where HAMi-core takes its cross-container locks (fixed in the library).
CONTAINER_LOCK_DIR = "/tmp/vgpulock"
#: The file in `cacheDirectory` that /etc/ld.so.preload is mounted from (written by the agent).
PRELOAD_FILE = "ld.so.preload"


def sm_percent(limit: ShareLimit) -> int:
    """A card's compute limit in percent, 1-100 (a share below 1 % is held to 1 %)."""
    return min(max(limit.milli, MILLI_PER_PERCENT), MILLI_PER_CARD) // MILLI_PER_PERCENT


class HamiCore:
    def __init__(self, config: HamiCoreConfig,
                 new_token: Callable[[], str] = lambda: uuidlib.uuid4().hex) -> None:
        self.config = config
        self._new_token = new_token

    @property
    def name(self) -> str:
        return "hami-core"

    def refusal(self, uuids: Sequence[str]) -> str | None:
        library = self.config.library
        if not os.path.isfile(library):
            return (f"hami-core: the library {library} is not on this node (install HAMi-core "
                    "there, or set sharing.hamiCore.library; docs/agent.md): refusing rather "
                    "than giving a share that nothing enforces")
        return None

    def settings(self, limits: Sequence[ShareLimit]) -> IsolationSettings:
        if all(limit.milli >= MILLI_PER_CARD for limit in limits):
            # Whole cards are the container's alone: nothing to intercept.
            return IsolationSettings(mode="exclusive")
        envs: dict[str, str] = {}
        ordinal = 0
        for limit in limits:
            for _ in range(limit.devices):
                if limit.memory_mib:
                    envs[f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"] = \
                        f"{limit.memory_mib // limit.devices}m"
                ordinal += 1
        # One compute limit for the whole container: the smallest share bounds every card;
        # 0 (HAMi-core: no limit, HAMi's value for a missing gpucores) when it asked none.
        envs["CUDA_DEVICE_SM_LIMIT"] = str(min(
            (sm_percent(limit) for limit in limits if limit.limit_compute), default=0))
        if sum(limit.devices for limit in limits) > 1:
            # a container on several cards (a multi-card share): each device's own limit too,
            # as HAMi's device plugin writes them (`CUDA_DEVICE_SM_LIMIT_<i>`)
            ordinal = 0
            for limit in limits:
                for _ in range(limit.devices):
                    envs[f"CUDA_DEVICE_SM_LIMIT_{ordinal}"] = str(
                        sm_percent(limit) if limit.limit_compute else 0)
                    ordinal += 1
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = CONTAINER_CACHE_FILE
        cache = self._container_directory()
        mounts = [MountSpec(CONTAINER_LIBRARY, self.config.library, read_only=True),
                  MountSpec(CONTAINER_CACHE_DIR, str(cache)),
                  MountSpec(CONTAINER_LOCK_DIR, self.config.lockDirectory)]
        if self.config.preload is Preload.ENV:
            envs["LD_PRELOAD"] = CONTAINER_LIBRARY
        else:
            mounts.append(MountSpec(CONTAINER_PRELOAD, str(self._preload_file()),
                                    read_only=True))
        return IsolationSettings(envs, tuple(mounts))

    def _container_directory(self) -> Path:
        """A new host directory for one container's usage cache (HAMi-core writes it)."""
        path = Path(self.config.cacheDirectory) / self._new_token()
        try:
            path.mkdir(parents=True, exist_ok=False)
            Path(self.config.lockDirectory).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise IsolationError(f"hami-core: cannot create {path}: {err}") from None
        return path

    def _preload_file(self) -> Path:
        """The file mounted as the container's /etc/ld.so.preload: the library's path."""
        path = Path(self.config.cacheDirectory) / PRELOAD_FILE
        text = CONTAINER_LIBRARY + "\n"
        try:
            if not path.is_file() or path.read_text() != text:
                tmp = path.with_name(PRELOAD_FILE + ".tmp")
                tmp.write_text(text)
                tmp.replace(path)
        except OSError as err:
            raise IsolationError(f"hami-core: cannot write {path}: {err}") from None
        return path
