"""Which pods to evict so that a preemptor's GPUs fit on a node: a decision, apart from I/O.

kube-scheduler proposes victims that free what its plugins count (CPU, memory, pod slots and
the node-level GPU count `node.elasticgpu.io/gpu-core`, which does not see cards). Whether they
free the right *cards* only the engine can tell: `victims_on` starts from kube-scheduler's
victims and, if their cards are not enough, adds lower-priority pods holding cards on that node,
lowest priority and smallest hold first, until the pod fits; then gives back every added pod
the fit does not need (highest priority, largest hold first). Only pods of lower priority than
the preemptor are ever added; kube-scheduler's own victims are kept (they may free something
the extender does not see).

It asks the engine's own fit test by releasing holds and allocating them again: the engine is
left exactly as it was found (every hold released is allocated again before it returns), and
the caller holds whatever lock keeps others from seeing the what-if.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.request import PodRequest


def victims_on(engine: Engine, pod: PodRequest, node: str, victims: Sequence[str],
               holds: Mapping[str, Assignment], residents: Mapping[str, int],
               preemptor_priority: int) -> list[str] | None:
    """The victims on `node` whose removal lets `pod` fit, or None when none do.

    `holds`: key -> the cards the engine holds for it (pods and others); `residents`: the pods
    holding cards on `node`, uid -> priority, in the order ties are broken."""
    released: list[tuple[str, Assignment]] = []

    def release(victim: str) -> None:
        held = holds.get(victim)
        if held is not None and held.node == node and engine.allocation(victim) is not None:
            engine.release(victim)
            released.append((victim, held))

    try:
        for victim in victims:
            release(victim)
        if engine.filter(pod, [node]).feasible:
            return list(victims)
        extra = sorted(
            (uid for uid, priority in residents.items()
             if uid not in victims and priority < preemptor_priority),
            key=lambda u: (residents[u], sum(s.milli for s in holds[u].shares())))
        added: list[str] = []
        for uid in extra:
            release(uid)
            added.append(uid)
            if engine.filter(pod, [node]).feasible:
                return list(victims) + _reprieve(engine, pod, node, added, released, residents)
        return None
    finally:
        for victim, held in reversed(released):
            engine.allocate(victim, held)


def _reprieve(engine: Engine, pod: PodRequest, node: str, added: list[str],
              released: list[tuple[str, Assignment]], residents: Mapping[str, int]) -> list[str]:
    """Of the pods `victims_on` added (all released, the pod fits), those the fit needs: each
    is put back in turn, highest priority and largest hold first, and stays back when the pod
    still fits (a low-priority pod on a card that did not help is not evicted)."""
    held = dict(released)
    order = sorted(added, key=lambda u: (-residents[u],
                                         -sum(s.milli for s in held[u].shares())))
    needed = set(added)
    for uid in order:
        engine.allocate(uid, held[uid])
        if engine.filter(pod, [node]).feasible:
            needed.discard(uid)
        else:
            engine.release(uid)
    return [uid for uid in added if uid in needed]
