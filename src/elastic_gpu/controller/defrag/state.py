"""What the defragmentation controller remembers between rounds, in memory.

Moves are remembered here, not on the owners: an annotation on a ReplicaSet, StatefulSet or
Job would need write access to every workload kind (RBAC the controller otherwise never
needs) and would be one more write that can fail half-way through a plan. The cost: a new
leader starts with an empty memory, so after a fail-over an owner may move once more before
its cool-down ends; the rate limits still bound the moves, and the Events of every move stay
in the API for whoever looks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elastic_gpu.core.defrag.limits import Eviction, RateLimits, recent
from elastic_gpu.core.defrag.movable import Memory


@dataclass(frozen=True)
class InFlight:
    """A plan carried out: no new plan until its pending pod is bound or `deadline` passes."""

    pending_key: str
    pending_uid: str
    deadline: float


@dataclass
class DefragState:
    #: owner uid -> when a pod of it was evicted
    moved_at: dict[str, float] = field(default_factory=dict)
    #: pod uid -> when a PodDisruptionBudget refused its eviction
    refused_at: dict[str, float] = field(default_factory=dict)
    evictions: list[Eviction] = field(default_factory=list)
    in_flight: InFlight | None = None
    #: pending pod key -> the plan last recorded on it (`elasticgpu.io/defrag-plan`, its
    #: text): report mode writes and logs a plan once per change; a record no plan backs any
    #: more is removed
    recorded: dict[str, str] = field(default_factory=dict)

    def memory(self) -> Memory:
        return Memory(self.moved_at, self.refused_at)

    def forget_old(self, now: float, cool_down_s: float, limits: RateLimits) -> None:
        self.moved_at = {k: t for k, t in self.moved_at.items() if now - t < cool_down_s}
        self.refused_at = {k: t for k, t in self.refused_at.items() if now - t < cool_down_s}
        self.evictions = recent(self.evictions, now, limits)
