"""What every part of the state shares: the config, the clocks, the one lock, the engine (with
what it has not taken in yet), the version counter and readiness. Each part gets the handle in
its constructor, as kube-scheduler's plugins get a framework handle, and keeps its own fields.

One lock for all parts, as before the state was cut into parts: a filter must see every
earlier reservation, and an inventory change recounts holds and reservations in one step. Every
method `SchedulerState` exposes takes `lock` (an `RLock`: one such method may call another) and
runs to completion without awaiting, except the reads documented as lock-free; the seam
methods, which only other parts call (`Ledger.sync`, `Wakeups.mark_freed`, `Inventory.flush`,
...), run under their caller's hold of it and never take it alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from elastic_gpu.core.claims.inventory import ledger_key
from elastic_gpu.core.model import Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.workload import TargetWorkload
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state.records import StateNotReady

#: Prefix of ElasticGPU ledger keys (`core.claims.ledger_key`); never a pod UID.
EGPU_KEY = ledger_key("")
#: The feeds of the Elastic GPU API (their CRDs missing = none exist, `apiworker`).
CLAIM_SOURCES = frozenset({"elasticgpus", "elasticgpuclaims", "elasticgpuclasses"})


class StateHandle:
    """The shared facts of the state's parts; the engine is replaced whole on a relist
    (`Inventory`), so parts read `handle.engine` each time and never keep it."""

    def __init__(self, config: SchedulerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config or SchedulerConfig()
        self.clock = clock
        #: the wall clock, for the expiry of defragmentation reservations (absolute times
        #: another process wrote: `core.defrag.reservation`)
        self.wall = wall_clock
        self.lock = threading.RLock()
        #: the engine's target workload: None is the built-in default, "observed" replaces it
        #: (`PodUsage.refresh_workload`); a new engine is built with it
        self.workload: TargetWorkload | None = None
        self.engine = self.new_engine(())
        #: nodes whose inventory changed and is not in the engine yet (`Inventory.flush` takes
        #: them in): a hold on one of them cannot be counted before then
        self.stale_nodes: set[str] = set()
        #: nodes the engine knows, as of the last flush (a frozenset, replaced whole, so it
        #: can be read outside the lock)
        self.known: frozenset[str] = frozenset()
        #: bumped by every change of the engine's allocations or inventory
        self.version = 0
        self.synced: set[str] = set()
        self.required_sources: frozenset[str] = frozenset({"nodes", "pods", "gpudevices"}) \
            | CLAIM_SOURCES

    def bump(self) -> None:
        """The engine's allocations or inventory changed (cached scores are stale)."""
        self.version += 1

    @property
    def ready(self) -> bool:
        return self.required_sources <= self.synced

    def not_ready_reason(self) -> str:
        missing = ", ".join(sorted(self.required_sources - self.synced))
        return f"the Elastic GPU scheduler has not synced its caches yet ({missing}); retry shortly"

    def require_ready(self) -> None:
        if not self.ready:
            raise StateNotReady(self.not_ready_reason())

    def new_engine(self, nodes: Iterable[Node]) -> Engine:
        policy = PolicyConfig(node_policy=self.config.node_policy,
                              card_policy=self.config.card_policy,
                              check_host_resources=False,
                              load_aware=self.config.load_aware)
        return Engine(nodes, config=policy, seed=self.config.seed, workload=self.workload)
