"""Which free MIG instance of a profile a request takes on a node: one decision for both paths
(the device-plugin path's engine, `core.placement.planning`, and the DRA allocator through the
same engine). Pure, no I/O.

Kube-scheduler's DRA allocator, and our engine before this rule, took the first free instance in
card order. That splits a node's MIG demand across cards: an instance on a card nothing else
holds is taken while a card already partly held has one free too, so neither card can be merged
back into a whole card (dynamic MIG, docs/mig-dynamic.md) and the free instances are spread
thin. The rule, best fit:

1. a card something already holds an instance of (partly held) before a card with no holder
   (one the dynamic-MIG planner could merge back);
2. then the card with the fewest free instances left (the fullest);
3. then the lower card index, and on a card the lower start slot (deterministic).

Between nodes the same first point holds (`core.placement.engine`, for the extender's answers
and the DRA allocator alike): a node where every instance the pod would take is on a partly
held card (`on_partly_held`) comes before one where some would open a card nothing holds; the
node policy orders nodes of equal standing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence

from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.resources import MigProfile


def partly_held(card: Card, held: Container[str]) -> bool:
    """Whether something holds an instance of the card (`held`: instance uuids taken)."""
    return any(i.uuid in held for i in card.mig)


def card_rank(card: Card, held: Container[str]) -> tuple[int, int, int]:
    """A card's place in the order its free instances are taken (smaller first): partly held
    first, then fewest free healthy instances, then index. `held`: instance uuids taken."""
    free = sum(1 for i in card.mig if i.uuid not in held and i.health is Health.HEALTHY)
    return (*fill_rank(partly_held(card, held), free), card.index)


def fill_rank(partly: bool, free: int) -> tuple[int, int]:
    """The rule's first two points as a sort key (smaller first) for a card that is `partly`
    held and has `free` free instances: `card_rank` here, and the dynamic-MIG planner's free
    instances (`core.mig.planner` step 1, on its own card state) take them in this order."""
    return (0 if partly else 1, free)


def on_partly_held(by_uuid: Mapping[str, Card], held: Collection[str],
                   asked: Mapping[MigProfile, int],
                   usable: Callable[[Card], bool] = lambda _card: True) -> bool:
    """Whether the partly held cards of a node (`by_uuid`: its instances' cards by instance
    uuid; `held`: the uuids something holds) have free healthy instances enough for every
    profile of `asked` (profile -> instances), on cards `usable` accepts: the pod's instances
    then all go there (`free_instances` takes those first), no card opened. False when nothing
    is asked or nothing is held. Costs the held instances and their cards' instances only."""
    if not asked or not held:
        return False
    cards = {by_uuid[u].index: by_uuid[u] for u in held if u in by_uuid}
    free: dict[MigProfile, int] = {}
    for card in cards.values():
        if not card.healthy or not usable(card):
            continue
        for i in card.mig:
            if i.profile in asked and i.uuid not in held and i.health is Health.HEALTHY:
                free[i.profile] = free.get(i.profile, 0) + 1
    return all(free.get(profile, 0) >= n for profile, n in asked.items())


def free_instances(cards: Iterable[Card], profile: MigProfile, held: Container[str],
                   usable: Callable[[Card], bool] = lambda _card: True
                   ) -> list[tuple[Card, MigInstance]]:
    """The node's free healthy instances of `profile` on the cards `usable` accepts, in the
    order a request takes them (the module's rule)."""
    ranked: list[tuple[tuple[int, int, int], int, Card, MigInstance]] = []
    for card in cards:
        if not card.healthy or not usable(card):
            continue
        rank = card_rank(card, held)
        for inst in card.mig:
            if (inst.profile == profile and inst.health is Health.HEALTHY
                    and inst.uuid not in held):
                ranked.append((rank, inst.start, card, inst))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(card, inst) for _, _, card, inst in ranked]


def take(found: Sequence[tuple[Card, MigInstance]], count: int, distinct: bool
         ) -> list[tuple[Card, MigInstance]]:
    """`count` of `found` in order (at most one per card when `distinct`); fewer when there are
    not enough."""
    out: list[tuple[Card, MigInstance]] = []
    cards: set[int] = set()
    for card, inst in found:
        if len(out) == count:
            break
        if distinct and card.index in cards:
            continue
        cards.add(card.index)
        out.append((card, inst))
    return out
