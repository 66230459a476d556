"""Whether preparing one more claim would put a device of this node over capacity. Pure, no I/O.

kube-scheduler's allocator never gives a card more than its `compute` and `memory` capacity
across the claims *it* sees, and our allocator holds every allocated claim as a fact. Yet a
card can still be given twice: kube-scheduler allocates from a cache that lags ours (for a pod
it retries, an `nvidia.com/gpu` pod through the extended-resource mapping, another DeviceClass)
after our allocator's check (`core.dra.turn`), an admin writes an allocation by hand. The node
is the last place that can say no: the kubelet plugin (`agent.dra.kubelet_plugin`) sums, per
card, what the claims already prepared on the node hold (its checkpoint) plus what the new
claim would, and refuses the new claim when a card would go past its compute or memory, or a
MIG instance would have two holders. The claims already prepared keep what they got (their
containers run); the refused one fails its pod's start, with this module's sentence in
kubelet's error and in an Event on the pod.

A card holding a whole-card claim is full (`core.dra.allocation`: a claim asking no capacity
consumes the whole card), so whole-card allocations are exclusive by the same sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.dra.devices import card_device, mig_device
from elastic_gpu.core.dra.inventory import (
    CLAIM_KEY_PREFIX,
    allocated_pools,
    claim_hold,
    claim_key,
    placeable_cards,
    tables_of,
)
from elastic_gpu.core.model import Card
from elastic_gpu.core.resources import MILLI_PER_PERCENT

#: The Event's reason on a pod whose claim is refused for this.
REASON = "DeviceOverCapacity"
#: The Warning Event's reason on a gated pod whose claims our allocator took back, a card they
#: hold having been given twice before its gate lifted (`claims_overflowing`).
TAKEN_BACK_REASON = "DRAClaimTakenBack"


@dataclass(frozen=True)
class Holding:
    """One device a claim holds (or would hold) on this node, as a card share."""

    claim: str  # "<namespace>/<name>"
    device: str
    share: CardShare


@dataclass(frozen=True)
class Overflow:
    """A device the new claim would put over capacity, and who holds it already."""

    device: str
    #: compute (milli-cards) and memory (MiB) the holders would sum to, and the card's
    milli: int
    memory_mib: int
    card_milli: int
    card_memory_mib: int
    #: a MIG instance's holders (more than one is over capacity)
    mig: bool
    holders: tuple[Holding, ...]

    def describe(self, holders_are: str = "prepared on this node") -> str:
        """The sentence; `holders_are` says what the holders are (the node: prepared; the
        allocator: allocated)."""
        others = ", ".join(_held(h) for h in self.holders)
        if self.mig:
            return f"MIG device {self.device} is already {holders_are.split()[0]} for {others}"
        over = []
        if self.milli > self.card_milli:
            over.append(f"compute {_pct(self.milli)} % of {_pct(self.card_milli)} %")
        if self.memory_mib > self.card_memory_mib:
            over.append(f"memory {self.memory_mib} of {self.card_memory_mib} MiB")
        return (f"device {self.device} would hold {' and '.join(over)} with the claims "
                f"{holders_are} ({others})")


def _pct(milli: int) -> str:
    whole, rest = divmod(milli, MILLI_PER_PERCENT)
    return str(whole) if not rest else f"{milli / MILLI_PER_PERCENT:g}"


def _held(h: Holding) -> str:
    s = h.share
    if s.mig_uuid is not None:
        return h.claim
    return f"{h.claim}: {_pct(s.milli)} %, {s.memory_mib} MiB"


def overflows(cards: Sequence[Card], prepared: Iterable[Holding],
              new: Sequence[Holding]) -> list[Overflow]:
    """The devices `new` (one claim's holdings) would put over capacity beside `prepared` (the
    claims prepared on this node, the new claim's own uid left out); [] when it fits. Only the
    cards `new` touches are checked: a card already over without it is not this claim's doing.
    A device of a card this node does not have is not judged here (the allocation's own
    reading refuses it)."""
    by_index = {c.index: c for c in cards}
    mine_cards = {h.share.index for h in new if h.share.mig_uuid is None}
    mine_migs = {h.share.mig_uuid for h in new if h.share.mig_uuid is not None}
    cards_held: dict[int, list[Holding]] = {}
    migs_held: dict[str, list[Holding]] = {}
    for h in prepared:
        if h.share.mig_uuid is not None:
            if h.share.mig_uuid in mine_migs:
                migs_held.setdefault(h.share.mig_uuid, []).append(h)
        elif h.share.index in mine_cards:
            cards_held.setdefault(h.share.index, []).append(h)
    out: list[Overflow] = []
    seen: set[str] = set()
    for h in new:
        share = h.share
        if share.mig_uuid is not None:
            holders = migs_held.get(share.mig_uuid, [])
            if holders and share.mig_uuid not in seen:
                seen.add(share.mig_uuid)
                out.append(Overflow(h.device, 0, 0, 0, 0, True, tuple(holders)))
            continue
        card = by_index.get(share.index)
        if card is None or f"card {share.index}" in seen:
            continue
        seen.add(f"card {share.index}")
        mine = [n for n in new if n.share.mig_uuid is None and n.share.index == share.index]
        holders = cards_held.get(share.index, [])
        milli = sum(x.share.milli for x in (*holders, *mine))
        memory = sum(x.share.memory_mib for x in (*holders, *mine))
        if milli > card.compute_milli or memory > card.memory_mib:
            out.append(Overflow(h.device, milli, memory, card.compute_milli, card.memory_mib,
                                False, tuple(holders)))
    return out


def refusal(claim: str, found: Sequence[Overflow]) -> str | None:
    """The per-claim error kubelet is answered (and the Event's message); None: it fits."""
    if not found:
        return None
    return (f"{claim}: refused, it would put a device over capacity: "
            + "; ".join(o.describe() for o in found)
            + " (allocated past what the card has: by kube-scheduler from a cache that had "
            "not seen the other claim, or through another DeviceClass selecting these "
            "devices; the pod can start once the holders are gone)")


def claims_overflowing(mine: Iterable[str], holds: Mapping[str, Assignment],
                       cards: Mapping[str, Sequence[Card]]) -> list[Overflow]:
    """The allocator's check before it lifts a pod's gate: whether the claims `mine` (keys of
    `holds`, every allocated claim's hold as `core.dra.inventory.claim_hold` reads it) put a
    card past its capacity beside all the others (kube-scheduler allocated one from a cache
    that had not seen ours). [] when they fit."""
    keys = set(mine)
    found: list[Overflow] = []
    for node in sorted({holds[k].node for k in keys if k in holds}):
        others: list[Holding] = []
        ours: list[Holding] = []
        for key, hold in holds.items():
            if hold.node == node:
                (ours if key in keys else others).extend(
                    Holding(key.removeprefix(CLAIM_KEY_PREFIX),
                            f"{_device(share, cards.get(node, ()))} of node {node}", share)
                    for share in hold.shares())
        found += overflows(cards.get(node, ()), others, ours)
    return found


def _device(share: CardShare, cards: Sequence[Card]) -> str:
    """The device's name a share holds: its MIG instance's, else its card's."""
    for card in cards:
        for instance in card.mig if share.mig_uuid is not None else ():
            if instance.uuid == share.mig_uuid:
                return mig_device(card.index, instance)
    return card_device(share.index)


def given_twice(namespace: str, names: Sequence[str], claims: Iterable[Mapping[str, Any]],
                slices: Iterable[Mapping[str, Any]]) -> list[Overflow]:
    """`claims_overflowing` for the allocated claims `names` of `namespace`, from every claim
    and this driver's slices as the API holds them (only the nodes they are on are read)."""
    cards = placeable_cards(slices)  # the cards and the MIG-carved cards' instances
    tables = tables_of(cards)
    claims = list(claims)
    keys = {claim_key(namespace, n) for n in names}
    by_key = {claim_key(str(_meta(c).get("namespace")), str(_meta(c).get("name"))): c
              for c in claims}
    nodes = {n for k in keys for n in allocated_pools(by_key.get(k) or {})}
    holds = {}
    for key, claim in by_key.items():
        if allocated_pools(claim) & nodes:
            hold = claim_hold(claim, tables)
            if hold is not None:
                holds[key] = hold
    return claims_overflowing(keys, holds, {n: cards.get(n, []) for n in nodes})


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


def taken_back_message(claims: Sequence[str], found: Sequence[Overflow]) -> str:
    """The Event's message when the allocator clears its own allocation of `claims` because a
    card they hold went over (`found`, from `claims_overflowing`)."""
    return (f"allocation of claim {', '.join(claims)} taken back before the pod's gate was "
            f"lifted: a card was given twice: "
            + "; ".join(o.describe("allocated on the node") for o in found)
            + " (the others allocated by another writer, kube-scheduler's allocator for a pod "
            "our gate does not hold, from a cache that had not seen ours); the pod stays gated "
            "and is placed again")
