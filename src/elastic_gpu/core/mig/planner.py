"""The dynamic-MIG planner (issue 42): which cards to carve, re-carve or merge back. Pure.

`plan(demand, cards, whole, now=, config=)` decides one round from what waits and what the
cards hold (`core.mig.cardstate`). Held instances are never touched: they stay at their
placement in every target layout, and a card held whole is never changed. In order:

1. **Free instances first.** A MIG demand whose exact profile is free on a card it may use
   takes it (`Plan.matched`), no layout changes; in `core.mig.pick`'s order (partly held
   cards first, then the fullest), the one the scheduler would take. A demand with
   `alternatives` (a DRA claim's `||`, memory bound or `firstAvailable`) takes the first of
   its choices that is free, in order; and below, the first that can be carved at all (a
   choice only a whole card can take waits for step 4 rather than a later choice being
   carved beside a carved card now).
2. **Carved cards.** The rest, largest profile first, go to cards already in MIG mode (or
   carved this round): beside the layout as it is (best fit: the card left with the least
   headroom, so other cards stay open), else with free instances moved to other starts, else
   with the fewest free instances destroyed. Among cards, the fewest instances destroyed, then
   moved, then best fit, then node and card names.
3. **Whole-card demand** (`WholeDemand`: cards on one node) reserves, on a node where it would
   then fit, the free whole cards and as many carved cards with no holder as it lacks, merged
   back (`CardPlan.merge`: every instance destroyed, MIG mode off) once their layout has been
   unchanged for `PlannerConfig.merge_cooldown_s`.
4. **Whole cards carved.** MIG demand still waiting carves a whole card no whole-card demand
   reserved (`pack`: the placement that leaves the most headroom).

Everything placed follows NVIDIA's placement rules (`core.mig.layout`); the layouts are the
targets the MigLayout objects carry, and the agent applies them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from elastic_gpu.core.mig.cardstate import (
    CardPlan,
    CardState,
    Instance,
    MigDemand,
    Plan,
    PlannerConfig,
    WholeDemand,
)
from elastic_gpu.core.mig.layout import Placement, headroom, pack
from elastic_gpu.core.mig.pick import fill_rank
from elastic_gpu.core.mig.profiles import MigModel, mig_model
from elastic_gpu.core.resources import MigProfile


@dataclass
class _Card:
    """One card while a round is decided (internal, mutable)."""

    state: CardState
    model: MigModel | None
    kept: list[Instance]
    #: instance uuids given to demand this round (held from now on)
    taken: set[str] = field(default_factory=set)
    created: list[Placement] = field(default_factory=list)
    destroyed: list[Instance] = field(default_factory=list)
    serves: list[str] = field(default_factory=list)
    merge: bool = False
    reserved: bool = False
    #: the groups of the demand it serves this round (`MigDemand.group`: one card each)
    groups: set[str] = field(default_factory=set)

    @property
    def touched(self) -> bool:
        return bool(self.created or self.destroyed or self.merge)

    @property
    def mig_on(self) -> bool:
        return bool(self.kept or self.created) or (self.state.mig_mode and not self.merge)

    def layout(self) -> list[Placement]:
        return [i.placement for i in self.kept] + list(self.created)

    def pinned(self) -> list[Placement]:
        """What may not move: held instances, those taken this round, those created."""
        return [i.placement for i in self.kept if i.held or i.uuid in self.taken] + \
            list(self.created)

    def movable(self) -> list[Instance]:
        return [i for i in self.kept if not i.held and i.uuid not in self.taken]

    def plan(self, reason: str) -> CardPlan:
        s = self.state
        return CardPlan(s.node, s.uuid, s.model, tuple(self.layout()), tuple(self.destroyed),
                        tuple(self.created), tuple(self.serves), self.merge, reason)


@dataclass(frozen=True)
class _Option:
    """One way to carve a profile on one card."""

    key: tuple[int, int, int, int, int, str, str]
    card: _Card
    #: the movable instances destroyed, and all the placements created (the new one last)
    destroy: tuple[Instance, ...]
    create: tuple[Placement, ...]


@dataclass
class _Groups:
    """Demand groups (`MigDemand.group`: one container's instances on distinct cards of one
    node) while a round is decided: each group's size, its node once its first demand is
    placed, and per node how many cards could take an instance at all."""

    sizes: dict[str, int]
    room: dict[str, int]
    homes: dict[str, str] = field(default_factory=dict)

    def allows(self, d: MigDemand, c: _Card) -> bool:
        if d.group is None:
            return True
        node = c.state.node
        home = self.homes.get(d.group)
        if home is None:  # the group's first: a node with a card for each of the group
            return self.room.get(node, 0) >= self.sizes[d.group]
        return home == node and d.group not in c.groups

    def serve(self, c: _Card, d: MigDemand) -> None:
        """Card `c` serves `d` this round: no other demand of its group goes there."""
        if d.group is not None:
            c.groups.add(d.group)
            self.homes.setdefault(d.group, c.state.node)


def _allowed(d: MigDemand, c: _Card, groups: _Groups) -> bool:
    """Whether `d` may go on card `c`: its nodes, models and group (`_Groups.allows`)."""
    s = c.state
    return ((d.nodes is None or s.node in d.nodes) and (d.models is None or s.model in d.models)
            and groups.allows(d, c))


def _carve_option(profile: MigProfile, c: _Card, cls: int) -> _Option | None:
    """The cheapest way to add `profile` to card `c` (keeping pinned instances): as it is,
    else with free instances moved, else with the fewest free instances destroyed."""
    model = c.model
    if model is None or model.size(profile) is None:
        return None
    s = c.state
    placed = pack(model, [profile], c.layout())
    if placed is not None:
        room = headroom(model, [*c.layout(), *placed])
        return _Option((cls, 0, 0, room.total, -room.largest, s.node, s.uuid), c, (), placed)
    movable = c.movable()
    for drop in range(len(movable) + 1):
        found: _Option | None = None
        for gone in itertools.combinations(range(len(movable)), drop):
            rest = [m for k, m in enumerate(movable) if k not in gone]
            placed = pack(model, [m.placement.profile for m in rest] + [profile], c.pinned())
            if placed is None:
                continue
            # an instance whose place is among the new ones stays; the others are re-created
            wanted = list(placed)
            stays = set()
            for m in rest:
                if m.placement in wanted:
                    wanted.remove(m.placement)
                    stays.add(m.uuid)
            destroy = tuple(m for m in movable if m.uuid not in stays)
            create = tuple(wanted)
            moved = [m for m in rest if m.uuid not in stays]
            room = headroom(model, [*c.pinned(), *placed])
            option = _Option((cls, drop, len(moved), room.total, -room.largest, s.node, s.uuid),
                             c, destroy, create)
            if found is None or option.key < found.key:
                found = option
        if found is not None:
            return found
    return None


def _apply(option: _Option, d: MigDemand, groups: _Groups) -> None:
    c = option.card
    gone = {i.uuid for i in option.destroy}
    c.kept = [i for i in c.kept if i.uuid not in gone]
    c.destroyed.extend(option.destroy)
    c.created.extend(option.create)
    c.serves.append(d.key)
    groups.serve(c, d)


def _merge_ready(c: _Card, now: float, config: PlannerConfig) -> bool:
    s = c.state
    return (s.changeable and s.carved and not c.touched and not c.taken and not c.reserved
            and not any(i.held for i in c.kept)
            and (s.changed_at is None or now - s.changed_at >= config.merge_cooldown_s))


def _whole_free(c: _Card) -> bool:
    s = c.state
    return not s.carved and not c.touched and not s.held_whole and s.healthy and not c.reserved


def plan(demand: Sequence[MigDemand], cards: Sequence[CardState],
         whole: Sequence[WholeDemand] = (), *, now: float = 0.0,
         config: PlannerConfig = PlannerConfig()  # noqa: B008 (frozen)
         ) -> Plan:
    """One round (see the module's docstring): the cards to change so that the waiting MIG
    demand is served with the least fragmentation, whole cards merged back for waiting
    whole-card demand, held instances untouched. Deterministic for the same inputs."""
    work = [_Card(s, mig_model(s.model), list(s.instances)) for s in
            sorted(cards, key=lambda s: (s.node, s.uuid))]
    matched: list[tuple[str, str]] = []
    waiting: list[MigDemand] = []
    budget = config.max_cards_per_round or len(work) + 1
    takers: dict[str, int] = {}  # per node, the cards that could take an instance
    for c in work:
        if c.model is not None and c.state.healthy and (c.state.changeable or c.movable()):
            takers[c.state.node] = takers.get(c.state.node, 0) + 1
    sizes: dict[str, int] = {}
    for d in demand:
        if d.group is not None:
            sizes[d.group] = sizes.get(d.group, 0) + 1
    groups = _Groups(sizes, takers)

    # 1. free instances of the exact profile (the first of its choices free), in the order a
    # request takes them (`core.mig.pick`: partly held cards first, then the fullest), then by
    # node and card (the planner has no node policy)
    for d in demand:
        best: tuple[tuple[int, int, str, str, int], _Card, Instance] | None = None
        for profile in d.choices:
            for c in work:
                if not _allowed(d, c, groups) or c.model is None or not c.state.healthy:
                    continue
                spare = c.movable()
                rank = fill_rank(len(spare) < len(c.kept), len(spare))
                for i in spare:
                    if i.placement.profile == profile:
                        key = (*rank, c.state.node, c.state.uuid, i.placement.start)
                        if best is None or key < best[0]:
                            best = (key, c, i)
            if best is not None:
                break
        if best is None:
            waiting.append(d)
        else:
            best[1].taken.add(best[2].uuid)
            groups.serve(best[1], d)
            matched.append((d.key, best[2].uuid))

    def spent() -> bool:
        return sum(1 for c in work if c.touched) >= budget

    def carve(ds: list[MigDemand], whole_cards: bool) -> list[MigDemand]:
        left = []
        for d in sorted(ds, key=lambda d: (-d.profile.slices, -d.profile.memory_gb, d.key)):
            found: _Option | None = None
            full = spent()
            for profile in d.choices:  # the first of its choices that can be carved
                options = []
                # whole cards of one model are alike: the first (by node, card) is chosen
                whole_seen: set[str] = set()
                later = False  # a whole card could take it (step 4): no later choice now
                for c in work:
                    if not c.state.changeable or c.merge or not _allowed(d, c, groups):
                        continue
                    if c.mig_on:
                        if c.touched or not full:
                            options.append(_carve_option(profile, c, 0))
                    elif not full and c.state.model not in whole_seen and _whole_free(c):
                        whole_seen.add(c.state.model)
                        option = _carve_option(profile, c, 1)
                        if whole_cards:
                            options.append(option)
                        elif option is not None:
                            later = True
                found = min((o for o in options if o is not None), key=lambda o: o.key,
                            default=None)
                if found is not None or later:
                    break
            if found is None:
                left.append(d)
            else:
                _apply(found, d, groups)
        return left

    # 2. carved cards
    waiting = carve(waiting, whole_cards=False)

    # 3. whole-card demand: free whole cards, and carved cards with no holder merged back
    whole_waiting = []
    reserved: list[tuple[str, str]] = []
    for w in whole:
        by_node: dict[str, list[_Card]] = {}
        for c in work:
            if w.nodes is None or c.state.node in w.nodes:
                by_node.setdefault(c.state.node, []).append(c)
        for node in sorted(by_node):
            free = [c for c in by_node[node] if _whole_free(c)]
            ready = sorted((c for c in by_node[node] if _merge_ready(c, now, config)),
                           key=lambda c: (len(c.kept), c.state.uuid))
            lack = max(0, w.cards - len(free))
            if lack > len(ready) or (lack and sum(1 for c in work if c.touched) + lack > budget):
                continue
            for c in free[:w.cards]:
                c.reserved = True
                reserved.append((w.key, c.state.uuid))
            for c in ready[:lack]:
                c.destroyed.extend(c.kept)
                c.kept = []
                c.merge = True
                c.reserved = True
                c.serves.append(w.key)
            break
        else:
            whole_waiting.append(w.key)

    # 4. whole cards carved for what still waits
    waiting = carve(waiting, whole_cards=True)

    plans = []
    for c in work:
        if not c.touched:
            continue
        if c.merge:
            reason = f"merged back to a whole card for {', '.join(c.serves)}"
        else:
            made = ", ".join(p.name for p in c.created)
            reason = f"carve {made} for {', '.join(c.serves)}"
            if c.destroyed:
                reason += f" (destroy free {', '.join(i.placement.name for i in c.destroyed)})"
        plans.append(c.plan(reason))
    return Plan(tuple(plans), tuple(matched),
                tuple(d.key for d in waiting) + tuple(whole_waiting), tuple(reserved))
