"""What pods hold of each card, summed from their assignment annotations (pure).

These sums are the GPUDevice allocation columns. Only pods that still hold their cards count:
bound to this node and holding them (`core.podlife.holds_cards`: a pod being deleted holds its
cards until its containers have stopped, as the extender counts it).

A share counts what it says (milli and MiB). A MIG instance counts its card fraction of the
card's compute (`core.mig.profiles.card_fraction`: a 3g instance of a 7-slice card 3/7 of it,
an A30 1g 1/4) and the profile's memory: the scheduler writes MIG shares with no milli, since
MIG instances are sold whole, which made a fully carved-up card read 0 %. A whole card counts
100 % and its memory (as the scheduler writes it). `share_use` is core's (`core.gpuview`),
which `egpu top` counts with too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.agent.matching import Candidate
from elastic_gpu.core.assignment import Assignment, CardShare, trusted_assignment
from elastic_gpu.core.gpuview import share_use
from elastic_gpu.core.model import Card
from elastic_gpu.core.podlife import holds_cards
from elastic_gpu.core.resources import MILLI_PER_CARD


@dataclass
class CardUse:
    """What pods hold of one card."""

    milli: int = 0
    memory_mib: int = 0
    #: `<namespace>/<pod> (<container>)`, every holder, in order.
    holders: list[str] = field(default_factory=list)


def holding_pods(pods: Iterable[Mapping[str, Any]], node: str
                 ) -> Iterable[tuple[str, Assignment]]:
    """(`<namespace>/<pod>`, assignment) of the pods on `node` that hold cards: bound here,
    holding them (`core.podlife.holds_cards`), with a readable assignment the scheduler's Binding wrote
    for this node (`core.assignment.distrust`). Bad annotations are skipped (the scheduler
    reports them; accounting must not stop on one)."""
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") != node or not holds_cards(pod):
            continue
        assignment = trusted_assignment(pod)
        if assignment is not None:
            meta = pod.get("metadata") or {}
            yield f"{meta.get('namespace')}/{meta.get('name')}", assignment


def card_usage(pods: Iterable[Mapping[str, Any]], node: str,
               cards: Mapping[int, Card]) -> dict[int, CardUse]:
    """{card index: CardUse} held by pods on `node`; `cards` gives MIG geometry (cards not
    in it are counted as their shares say)."""
    usage: dict[int, CardUse] = {}
    for name, assignment in sorted(holding_pods(pods, node), key=lambda item: item[0]):
        for container, shares in sorted(assignment.containers.items()):
            for share in shares:
                use = usage.setdefault(share.index, CardUse())
                milli, memory = share_use(share, cards.get(share.index))
                use.milli += milli
                use.memory_mib += memory
                holder = f"{name} ({container})"
                if holder not in use.holders:
                    use.holders.append(holder)
    return usage


@dataclass(frozen=True)
class ContainerShare:
    """What one container holds of one card (as `card_usage` counts it)."""

    namespace: str
    pod: str
    container: str
    index: int
    uuid: str
    milli: int
    memory_mib: int


def container_shares(pods: Iterable[Mapping[str, Any]], node: str,
                     cards: Mapping[int, Card]) -> list[ContainerShare]:
    """Every container's share of every card on `node`, counted as `card_usage` counts it
    (summed per card, they are its columns), sorted by pod, container and card."""
    out = []
    for name, assignment in sorted(holding_pods(pods, node), key=lambda item: item[0]):
        namespace, _, pod = name.partition("/")
        for container, shares in sorted(assignment.containers.items()):
            for share in shares:
                milli, memory = share_use(share, cards.get(share.index))
                out.append(ContainerShare(namespace, pod, container, share.index, share.uuid,
                                          milli, memory))
    return out


#: Holders named in an over-commit message.
MAX_NAMED = 5


def _held(pods: Iterable[Mapping[str, Any]], node: str, chosen: Candidate
          ) -> list[tuple[str, CardShare]]:
    """(holder, share) for every card share the pods holding cards on `node` hold
    (`holding_pods`), but `chosen`'s own: claim-backed shares once per ElasticGPU (pods sharing
    a claim share its cards). A terminating pod counts until its containers have stopped, as
    the scheduler counts it: the pods are a live, consistent list, so a card the scheduler gave
    again after they stopped shows them stopped here too."""
    own = f"{chosen.namespace}/{chosen.pod}"
    seen: set[tuple[str, ...]] = {("elasticgpu", chosen.claim) if chosen.claim
                                  else ("pod", own, chosen.container)}
    held: list[tuple[str, CardShare]] = []
    for name, assignment in holding_pods(pods, node):
        for container, shares in assignment.containers.items():
            claim = assignment.claims.get(container)
            key = ("elasticgpu", claim) if claim else ("pod", name, container)
            if key in seen:
                continue
            seen.add(key)
            holder = f"ElasticGPU {claim}" if claim else f"{name}[{container}]"
            held += [(holder, share) for share in shares]
    return held


def overcommit(chosen: Candidate, pods: Iterable[Mapping[str, Any]], node: str,
               memory_mib: Mapping[int, int]) -> str | None:
    """Why serving `chosen` would hand out a card beyond what it has, given the other live
    pods bound to `node` (`memory_mib`: each card's memory; None: it fits). Compute is counted
    in milli-cards (1000 a card; time-sliced replica shares carry their slots' compute), MIG
    instances by uuid."""
    milli: dict[int, int] = {}
    memory: dict[int, int] = {}
    holders: dict[int, list[str]] = {}
    instances: dict[str, str] = {}
    for holder, share in _held(pods, node, chosen):
        if share.mig_uuid:
            instances[share.mig_uuid] = holder
            continue
        milli[share.index] = milli.get(share.index, 0) + share.milli
        memory[share.index] = memory.get(share.index, 0) + share.memory_mib
        holders.setdefault(share.index, []).append(holder)
    for share in chosen.shares:
        if share.mig_uuid:
            if share.mig_uuid in instances:
                return (f"{chosen.describe()}: MIG instance {share.mig_uuid} is held by "
                        f"{instances[share.mig_uuid]}")
            continue
        others = ", ".join(holders.get(share.index, [])[:MAX_NAMED])
        if milli.get(share.index, 0) + share.milli > MILLI_PER_CARD:
            return (f"{chosen.describe()}: card {share.index} would be given "
                    f"{milli.get(share.index, 0) + share.milli} milli-cards of "
                    f"{MILLI_PER_CARD}; held by {others}")
        capacity = memory_mib.get(share.index)
        if capacity is not None and memory.get(share.index, 0) + share.memory_mib > capacity:
            return (f"{chosen.describe()}: card {share.index} would be given "
                    f"{memory.get(share.index, 0) + share.memory_mib} MiB of {capacity}; "
                    f"held by {others}")
    return None
