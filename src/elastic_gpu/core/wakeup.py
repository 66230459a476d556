"""Which pending pods to wake when GPU capacity frees. Pure: no I/O.

kube-scheduler retries a pod its extender turned away on any cluster event it sees, but GPU
capacity can free where it sees none (a card turns healthy, GPUDevices arrive after their Node)
or where it sees the event before the extender does (a GPU pod deleted: kube-scheduler retries
at once, the extender's watch has not delivered the deletion yet, the pod is turned away again).
Then nothing moves the pod until kube-scheduler's periodic flush of unschedulable pods, five
minutes later. The extender therefore remembers the pods its filter turned away for GPU reasons
(`Waiter`) and, when capacity frees on a node (`freed`: node -> the capacity epoch of its latest
freeing), wakes exactly the ones that now fit there.

No storm: a waiter is checked only against nodes freed after it was turned away (`since`), so
each capacity change wakes a pod at most once; the pods chosen claim what they would take (in
the engine, restored before returning), so one freed card wakes one pod that wants a whole
card, not every such pod; and a round checks and wakes at most a bounded number of pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elastic_gpu.core.placement import Engine, Unschedulable
from elastic_gpu.core.request import PodRequest

#: The engine key under which a woken pod's tentative claim is held during a round.
_CLAIM = "{uid}#wakeup-claim"


@dataclass(frozen=True)
class Waiter:
    """A pod the filter turned away for GPU reasons, as it was then."""

    uid: str
    request: PodRequest
    #: the nodes kube-scheduler asked about (those that passed its own filters); None: any
    #: node, because kube-scheduler sent only a sample of them (`SAMPLE_MIN_NODES`)
    nodes: frozenset[str] | None
    #: the capacity epoch when it was turned away: only later freeings can make it fit
    since: int
    priority: int = 0


@dataclass(frozen=True)
class Wake:
    """Wake this pod: it now fits on `node` (the first node found, not a placement)."""

    uid: str
    namespace: str
    name: str
    node: str
    #: why, when it is not GPU capacity freed on `node` (a claim the pod names became
    #: placeable: `node` is then its ElasticGPU's, or "" for any node)
    reason: str = ""


@dataclass(frozen=True)
class WakePlan:
    wake: tuple[Wake, ...]
    #: every waiter checked this round (woken or not): it has seen all capacity freed so far
    checked: tuple[str, ...]
    #: waiters with freed candidate nodes left unchecked because the round's bounds were hit
    deferred: int


#: kube-scheduler stops looking for feasible nodes once it has found
#: max(100, percentageOfNodesToScore of the cluster) and sends only those to extenders
#: (`minFeasibleNodesToFind`); fewer names than this are every node that passed its filters.
SAMPLE_MIN_NODES = 100


def asked_nodes(node_names: Sequence[str], cluster_nodes: int) -> frozenset[str] | None:
    """What a waiter remembers of the names a filter call was sent: all of them, or None (any
    node) when they may be kube-scheduler's sample of a larger set of feasible nodes."""
    if len(node_names) >= SAMPLE_MIN_NODES and len(node_names) < cluster_nodes:
        return None
    return frozenset(node_names)


def candidates(waiter: Waiter, freed: Mapping[str, int]) -> list[str]:
    """The nodes of `waiter` whose capacity freed after it was turned away, sorted."""
    if waiter.nodes is None:
        return sorted(n for n, epoch in freed.items() if epoch > waiter.since)
    if len(freed) <= len(waiter.nodes):
        return sorted(n for n, epoch in freed.items() if epoch > waiter.since and n in waiter.nodes)
    return sorted(n for n in waiter.nodes if freed.get(n, -1) > waiter.since)


def plan_wakeups(engine: Engine, waiters: Sequence[Waiter], freed: Mapping[str, int], *,
                 check_limit: int = 64, wake_limit: int = 32,
                 reserved: Mapping[str, str] | None = None) -> WakePlan:
    """The pods to wake now, highest priority first, then the longest waiting.

    A waiter is woken when it fits on one of its freed candidate nodes given the claims of the
    pods woken before it in this round (each claim is allocated in `engine` and released before
    returning, so the engine ends as it began). Fit is the engine's own (`Engine.best` with the
    deterministic binpack policy, then `assign` with the binpack card policy: no random draws).

    `reserved` (uid -> node): the waiters holding a defragmentation reservation, the room the
    controller made for them. Such a waiter is woken when its reservation's node is a freed
    candidate, without a fit check: the engine holds the reservation's cards under the
    waiter's own key, so its fit would see that room as taken, and a pod turned away just
    before the extender saw its evicted pods go was never woken (kube-scheduler's five-minute
    flush retried it).
    """
    own = reserved or {}
    order = sorted(waiters, key=lambda w: (-w.priority, w.since, w.uid))
    wake: list[Wake] = []
    checked: list[str] = []
    deferred = 0
    claims: list[str] = []
    try:
        for waiter in order:
            nodes = candidates(waiter, freed)
            if not nodes:
                continue
            if len(checked) >= check_limit or len(wake) >= wake_limit:
                deferred += 1
                continue
            checked.append(waiter.uid)
            if own.get(waiter.uid) in nodes:
                wake.append(Wake(waiter.uid, waiter.request.namespace, waiter.request.name,
                                 own[waiter.uid]))
                continue
            node = engine.best(waiter.request, nodes, policy="binpack")
            if node is None:
                continue
            try:
                assignment = engine.assign(waiter.request, node, card_policy="binpack")
                key = _CLAIM.format(uid=waiter.uid)
                engine.allocate(key, assignment)
            except (Unschedulable, KeyError, ValueError):
                continue
            claims.append(key)
            wake.append(Wake(waiter.uid, waiter.request.namespace, waiter.request.name, node))
    finally:
        for key in reversed(claims):
            engine.release(key)
    return WakePlan(tuple(wake), tuple(checked), deferred)
