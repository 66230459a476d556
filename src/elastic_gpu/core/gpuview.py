"""The cluster's GPUs as `egpu top` shows them (pure): per node and card, who holds what, what
is free, health and fragmentation.

Built from what the API says: the nodes' cards (GPUDevice inventory; a DRA node's from its
ResourceSlices, `core.dra.sliceview`), the pods' assignment annotations (the scheduler's one
write per bind), the ElasticGPUs (a claim's cards) and, on DRA nodes, the allocated
ResourceClaims (each listed once, with the pods it is reserved for). A pod's
claim-backed containers hold nothing themselves: their cards are the ElasticGPU's, listed once
under it with the pods that use it. A MIG share counts its compute slices' fraction of the
card and its profile's memory, as the agent's GPUDevice columns count it.

**Free** is what can still be given: on a healthy card its compute and memory not held; on a
MIG-carved card only its free instances (a slice no instance covers cannot be given).
**Fragmentation** is the share of the free compute that sits on partly used cards (healthy, not
MIG-carved, some compute held): only shares can use it, a pod asking for a whole card cannot.
The dashboard computes the same measure in PromQL (docs/metrics.md).

**Observed** is what the card's node samples (GPUDevice `status.usage`, `core.usage`): memory
and utilisation per card, out-of-band memory (used by processes no holder accounts for), and
per holder what its containers use beside what they were allotted. Out-of-band memory is taken
off a card's free memory, as placement does. A holder whose containers use more memory than
its share is **above its share** (a share without a memory amount has none to exceed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag.record import PendingPlan
from elastic_gpu.core.dra.sliceview import ClaimHold
from elastic_gpu.core.mig.profiles import card_fraction
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.resources import MigProfile, ResourceError
from elastic_gpu.core.usage import CardUsage


@dataclass(frozen=True)
class Holder:
    """Something holding part of a card."""

    #: "pod", "elasticgpu" or "resourceclaim" (a DRA claim)
    kind: str
    #: `<namespace>/<pod>`, the ElasticGPU's name or `<namespace>/<claim>`
    name: str
    #: a pod's container; an ElasticGPU's claim `<namespace>/<claim>` ("" if unclaimed)
    detail: str
    milli: int
    memory_mib: int
    #: the MIG instance held (its profile and UUID), if it is one
    mig_profile: str | None = None
    mig_uuid: str | None = None
    #: the pods using an ElasticGPU or a ResourceClaim (`<namespace>/<pod>`)
    users: tuple[str, ...] = ()
    #: observed: the memory (MiB) its containers use on the card and their utilisation
    #: (percent of the card; None where not sampled per process); None: nothing observed
    observed_mib: int | None = None
    observed_sm: int | None = None

    @property
    def above_share(self) -> bool:
        """Its containers use more memory on the card than its share allots."""
        return (self.observed_mib is not None and self.memory_mib > 0
                and self.observed_mib > self.memory_mib)


@dataclass(frozen=True)
class MigView:
    profile: str
    uuid: str
    #: who holds it (`pod ns/name` or `elasticgpu name`), None if free
    holder: str | None


@dataclass(frozen=True)
class CardView:
    index: int
    uuid: str
    model: str
    healthy: bool
    compute_milli: int
    memory_mib: int
    used_milli: int
    used_mib: int
    holders: tuple[Holder, ...]
    mig: tuple[MigView, ...] = ()

    #: compute and memory of the free MIG instances (a MIG-carved card gives only those)
    mig_free: tuple[int, int] = (0, 0)
    #: what the card's node observes on it (None: nothing observed)
    usage: CardUsage | None = None

    @property
    def out_of_band_mib(self) -> int:
        return self.usage.out_of_band_mib if self.usage is not None else 0

    @property
    def free_milli(self) -> int:
        if not self.healthy:
            return 0
        return self.mig_free[0] if self.mig else max(self.compute_milli - self.used_milli, 0)

    @property
    def free_mib(self) -> int:
        if not self.healthy:
            return 0
        return self.mig_free[1] if self.mig else max(
            self.memory_mib - self.used_mib - self.out_of_band_mib, 0)

    @property
    def stranded_milli(self) -> int:
        """Free compute only a share can use: on a healthy, partly used, not MIG-carved card."""
        return self.free_milli if self.used_milli > 0 and not self.mig else 0

    @property
    def entirely_free(self) -> bool:
        return (self.healthy and not self.mig and self.used_milli == 0 and self.used_mib == 0
                and self.out_of_band_mib == 0)

    @property
    def above_share(self) -> int:
        """Holders whose containers use more memory than their share."""
        return sum(h.above_share for h in self.holders)


def _fragmentation(stranded: int, free: int) -> float:
    return stranded / free if free else 0.0


@dataclass(frozen=True)
class NodeView:
    name: str
    cards: tuple[CardView, ...]
    #: GPU resources the Node advertises with no GPUDevice inventory for it (an older agent,
    #: another vendor's device plugin): name -> count
    uninventoried: Mapping[str, int] = field(default_factory=dict)

    @property
    def compute_milli(self) -> int:
        return sum(c.compute_milli for c in self.cards)

    @property
    def used_milli(self) -> int:
        return sum(c.used_milli for c in self.cards)

    @property
    def free_milli(self) -> int:
        return sum(c.free_milli for c in self.cards)

    @property
    def memory_mib(self) -> int:
        return sum(c.memory_mib for c in self.cards)

    @property
    def used_mib(self) -> int:
        return sum(c.used_mib for c in self.cards)

    @property
    def free_mib(self) -> int:
        return sum(c.free_mib for c in self.cards)

    @property
    def stranded_milli(self) -> int:
        return sum(c.stranded_milli for c in self.cards)

    @property
    def free_cards(self) -> int:
        return sum(c.entirely_free for c in self.cards)

    @property
    def unhealthy(self) -> int:
        return sum(not c.healthy for c in self.cards)

    @property
    def fragmentation(self) -> float:
        return _fragmentation(self.stranded_milli, self.free_milli)

    @property
    def observed(self) -> bool:
        return any(c.usage is not None for c in self.cards)

    @property
    def observed_mib(self) -> int:
        return sum(c.usage.used_mib for c in self.cards if c.usage is not None)

    @property
    def out_of_band_mib(self) -> int:
        return sum(c.out_of_band_mib for c in self.cards)

    @property
    def above_share(self) -> int:
        return sum(c.above_share for c in self.cards)


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeView, ...]
    #: the defragmentation controller's latest plans for pods not bound yet (`egpu top`
    #: reads them off the pods it lists: `core.defrag.record`)
    plans: tuple[PendingPlan, ...] = ()

    @property
    def cards(self) -> int:
        return sum(len(n.cards) for n in self.nodes)

    @property
    def compute_milli(self) -> int:
        return sum(n.compute_milli for n in self.nodes)

    @property
    def used_milli(self) -> int:
        return sum(n.used_milli for n in self.nodes)

    @property
    def free_milli(self) -> int:
        return sum(n.free_milli for n in self.nodes)

    @property
    def memory_mib(self) -> int:
        return sum(n.memory_mib for n in self.nodes)

    @property
    def used_mib(self) -> int:
        return sum(n.used_mib for n in self.nodes)

    @property
    def free_mib(self) -> int:
        return sum(n.free_mib for n in self.nodes)

    @property
    def free_cards(self) -> int:
        return sum(n.free_cards for n in self.nodes)

    @property
    def unhealthy(self) -> int:
        return sum(n.unhealthy for n in self.nodes)

    @property
    def fragmentation(self) -> float:
        return _fragmentation(sum(n.stranded_milli for n in self.nodes), self.free_milli)

    @property
    def observed(self) -> bool:
        return any(n.observed for n in self.nodes)

    @property
    def out_of_band_mib(self) -> int:
        return sum(n.out_of_band_mib for n in self.nodes)

    @property
    def above_share(self) -> int:
        return sum(n.above_share for n in self.nodes)


@dataclass(frozen=True)
class PodHold:
    """A pod's assignment as read from the API."""

    namespace: str
    name: str
    assignment: Assignment


@dataclass(frozen=True)
class ElasticGPUHold:
    """An ElasticGPU's cards; `claim` is `<namespace>/<claim>` or ""."""

    name: str
    node: str
    shares: tuple[CardShare, ...]
    claim: str = ""


def _spanned(card: Card) -> int:
    return max((inst.start + inst.profile.slices for inst in card.mig), default=0)


def share_use(share: CardShare, card: Card | None) -> tuple[int, int]:
    """(milli, MiB) a share takes of its card: a MIG instance its card fraction
    (`core.mig.profiles.card_fraction`) of the card's compute, rounded down, and its profile's
    memory (the scheduler writes no milli for MIG)."""
    if share.mig_profile is None or card is None:
        return share.milli, share.memory_mib
    try:
        profile = MigProfile.parse(share.mig_profile)
    except ResourceError:
        return share.milli, share.memory_mib
    milli = math.floor(card.compute_milli * card_fraction(profile, card.model, _spanned(card)))
    return max(share.milli, milli), max(share.memory_mib, profile.memory_gb * 1024)


def build_view(nodes: Iterable[Node], pods: Iterable[PodHold],
               elasticgpus: Iterable[ElasticGPUHold] = (),
               uninventoried: Mapping[str, Mapping[str, int]] | None = None,
               resource_claims: Iterable[ClaimHold] = ()) -> ClusterView:
    """The view of `nodes` (sorted by name, cards by index) with what `pods`, `elasticgpus`
    and `resource_claims` (DRA nodes) hold. Holds on cards no node lists are left out (a node
    being removed); `uninventoried` adds nodes that advertise GPUs without inventory (node ->
    resource -> count)."""
    egpus = list(elasticgpus)
    by_card: dict[tuple[str, int], list[Holder]] = {}
    users: dict[str, list[str]] = {}
    for pod in pods:
        key = f"{pod.namespace}/{pod.name}"
        for egpu_name in sorted(set(pod.assignment.claims.values())):
            users.setdefault(egpu_name, []).append(key)
        own = pod.assignment.unclaimed()
        if own is None:
            continue
        for container, shares in sorted(own.containers.items()):
            for share in shares:
                by_card.setdefault((own.node, share.index), []).append(
                    Holder("pod", key, container, share.milli, share.memory_mib,
                           share.mig_profile, share.mig_uuid))
    for egpu in egpus:
        for share in egpu.shares:
            by_card.setdefault((egpu.node, share.index), []).append(
                Holder("elasticgpu", egpu.name, egpu.claim, share.milli, share.memory_mib,
                       share.mig_profile, share.mig_uuid, tuple(sorted(users.get(egpu.name, ())))))
    for claim in resource_claims:
        for share in claim.shares:
            by_card.setdefault((claim.node, share.index), []).append(
                Holder("resourceclaim", f"{claim.namespace}/{claim.name}", "", share.milli,
                       share.memory_mib, share.mig_profile, share.mig_uuid, claim.users))
    views = []
    for node in sorted(nodes, key=lambda n: n.name):
        cards = [_card_view(card, by_card.get((node.name, card.index), []))
                 for card in sorted(node.cards, key=lambda c: c.index)]
        views.append(NodeView(node.name, tuple(cards),
                              dict((uninventoried or {}).get(node.name, {}))))
    listed = {n.name for n in views}
    for name, resources in sorted((uninventoried or {}).items()):
        if name not in listed:
            views.append(NodeView(name, (), dict(resources)))
    return ClusterView(tuple(sorted(views, key=lambda v: v.name)))


def _observed(holder: Holder, usage: CardUsage | None) -> tuple[int | None, int | None]:
    """(MiB, SM percent) the holder's containers are observed to use on the card: a pod's
    container by name; an ElasticGPU's, every container of the pods using it. (None, None)
    when the card is not observed; (0, None) when observed and none of them is listed."""
    if usage is None:
        return None, None
    if holder.kind == "pod":
        mine = [u for u in usage.containers
                if f"{u.namespace}/{u.pod}" == holder.name and u.container == holder.detail]
    else:
        mine = [u for u in usage.containers if f"{u.namespace}/{u.pod}" in holder.users]
    sm = [u.sm_percent for u in mine if u.sm_percent is not None]
    return sum(u.memory_mib for u in mine), (sum(sm) if sm else None)


def _card_view(card: Card, holders: list[Holder]) -> CardView:
    counted = []
    used_milli = used_mib = 0
    for holder in holders:
        share = CardShare(card.index, card.uuid, holder.milli, holder.memory_mib,
                          holder.mig_profile, holder.mig_uuid)
        milli, mib = share_use(share, card)
        used_milli += milli
        used_mib += mib
        seen_mib, seen_sm = _observed(holder, card.usage)
        counted.append(Holder(holder.kind, holder.name, holder.detail, milli, mib,
                              holder.mig_profile, holder.mig_uuid, holder.users,
                              seen_mib, seen_sm))
    owner = {h.mig_uuid: f"{h.kind} {h.name}" for h in counted if h.mig_uuid}
    mig = tuple(MigView(inst.profile.name, inst.uuid, owner.get(inst.uuid))
                for inst in sorted(card.mig, key=lambda i: (i.start, i.uuid)))
    free = [share_use(CardShare(card.index, card.uuid, 0, 0, inst.profile.name, inst.uuid), card)
            for inst in card.mig if inst.uuid not in owner]
    return CardView(card.index, card.uuid, card.model, card.healthy, card.compute_milli,
                    card.memory_mib, used_milli, used_mib,
                    tuple(sorted(counted, key=lambda h: (h.kind != "pod", h.name, h.detail))),
                    mig, (sum(m for m, _ in free), sum(b for _, b in free)), card.usage)
