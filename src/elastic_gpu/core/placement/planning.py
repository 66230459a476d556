"""Planning: which cards of one node each GPU container of a pod gets, or why none.

Containers are planned in a fixed order (whole cards, MIG instances, then shares, larger first),
each on what the ones before left; the card policy chooses among the cards that fit (for a
multi-card share, N distinct cards: `CardPolicy.pick_shares`). Fit of the
requests the arrays do not cover (several GPU containers, MIG) is defined by this plan with the
tightest-first card policy.
"""

from __future__ import annotations

from collections.abc import Container

from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.fit import FitFailure, FitKind, Unit
from elastic_gpu.core.mig.pick import free_instances, take
from elastic_gpu.core.placement.layout import Layout
from elastic_gpu.core.placement.shortfalls import (
    cards_failure,
    least_need,
    out_of_band_share,
    out_of_band_whole,
    restricts_models,
    share_failure,
    tflops_failure,
    whole_shortfall,
)
from elastic_gpu.core.placement.task import task_shape
from elastic_gpu.core.policies import CardPolicy, CardView, ScoreContext
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind


class _Held:
    """The instances taken: the ledger's owners and this plan's own."""

    def __init__(self, owners: Container[str], planned: Container[str]) -> None:
        self.owners, self.planned = owners, planned

    def __contains__(self, uuid: object) -> bool:
        return uuid in self.owners or uuid in self.planned


def plan(lay: Layout, ctx: ScoreContext, row: int, pod: PodRequest, policy: CardPolicy,
         load_aware: bool = False) -> dict[str, tuple[CardShare, ...]] | FitFailure:
    """Cards for every GPU container on this node, or why there are none. With `load_aware`
    the card policy breaks its ties by the cards' observed load (`CardView.tie`)."""
    r = lay.rows[row]
    cols = [c for c in range(len(r.cards)) if lay.usable[row, c]
            and pod.accepts_card(r.cards[c])]
    cards = [r.cards[c] for c in cols]
    free_milli = [int(lay.cap_milli[row, c] - lay.used_milli[row, c]) for c in cols]
    free_mem = [int(lay.cap_mem[row, c] - lay.used_mem[row, c] - lay.oob_mem[row, c])
                for c in cols]
    # entirely free: nothing held by the ledger, no memory observed used out of band
    untouched = [bool(lay.used_milli[row, c] == 0 and lay.used_mem[row, c] == 0
                      and lay.oob_mem[row, c] == 0) for c in cols]
    used_rep = [int(lay.used_rep[row, c]) for c in cols]
    load = ([(int(lay.load_pct[row, c]), int(lay.seen_mem[row, c])) for c in cols]
            if load_aware else None)
    view = CardView(lay.view(row), task_shape(pod), cards, free_milli, free_mem, load)
    taken_mig: set[str] = set()
    plan: dict[str, tuple[CardShare, ...]] = {}

    def served(c: ContainerRequest) -> list[bool]:
        offer = lay.offer_mask(c.served_names)
        return [True] * len(cols) if offer is None else [bool(offer[row, col]) for col in cols]

    def order(c: ContainerRequest) -> tuple[int, int, int, int]:
        rank = {RequestKind.WHOLE: 0, RequestKind.MIG: 1, RequestKind.SHARE: 2}[c.kind]
        return (rank, -c.cards, -c.compute_milli, -c.memory_mib)

    for c in sorted(pod.gpu_containers, key=order):
        ok = served(c)
        if c.kind is RequestKind.WHOLE:
            replicas = plan_replicas(lay, ctx, row, c, policy, view, cols, ok, untouched,
                                     used_rep, pod)
            if replicas is not None:
                if isinstance(replicas, FitFailure):
                    return replicas
                plan[c.name] = replicas
                continue
            cand = [p for p in range(len(cards))
                    if ok[p] and untouched[p] and cards[p].memory_mib >= c.memory_mib]
            if len(cand) < c.cards:
                return (out_of_band_whole(lay, pod, row, c, ok, cols, untouched, len(cand))
                        or cards_failure(pod, c, len(cand), len(r.cards)))
            picked = policy.pick_whole(ctx, view, cand, c.cards)
            shares = []
            for p in picked:
                shares.append(CardShare(cards[p].index, cards[p].uuid, cards[p].compute_milli,
                                        cards[p].memory_mib))
                free_milli[p] = free_mem[p] = 0
                untouched[p] = False
            plan[c.name] = tuple(shares)
        elif c.kind is RequestKind.SHARE:
            # a TFLOPS share needs a compute that depends on the card's model
            need = [c.milli_on(card.model) for card in cards]
            cand = [p for p in range(len(cards))
                    if ok[p] and (m := need[p]) is not None and free_milli[p] >= m
                    and free_mem[p] >= c.memory_mib]
            if len(cand) < c.cards:
                served_cols = [col for p, col in enumerate(cols) if ok[p]]
                return (tflops_failure(lay, pod, row, c, served_cols)
                        or (out_of_band_share(lay, pod, row, c, ok, cols, free_milli, free_mem)
                            if not cand else None)
                        or share_failure(pod, c, len(r.cards),
                                         least_need(lay, row, c, served_cols), len(cand)))
            # the policy scores every candidate with one amount: the least the share needs
            # there (the same on a node of one model, the usual case)
            least = min(need[q] or 0 for q in cand)
            if c.cards == 1:
                picked = [policy.pick_share(ctx, view, cand, least, c.memory_mib)]
            else:  # a multi-card share: N distinct cards, one share of the shape on each
                picked = sorted(policy.pick_shares(ctx, view, cand, least, c.memory_mib,
                                                   c.cards), key=lambda q: cards[q].index)
            shares = []
            for p in picked:
                milli = need[p] or 0
                free_milli[p] -= milli
                free_mem[p] -= c.memory_mib
                untouched[p] = False
                shares.append(CardShare(cards[p].index, cards[p].uuid, milli, c.memory_mib))
            plan[c.name] = tuple(shares)
        elif c.kind is RequestKind.MIG:
            assert c.mig_profile is not None
            profile_total = 0
            profile_cards = 0  # cards with the profile at all (distinct: the capacity)
            mig_offer = lay.offer_mask(c.served_names)
            allowed: set[int] = set()
            for col, card in enumerate(r.cards):
                if not card.healthy or not pod.accepts_card(card):
                    continue
                if mig_offer is not None and not mig_offer[row, col]:
                    continue
                allowed.add(col)
                profile_cards += any(i.profile == c.mig_profile for i in card.mig)
                profile_total += sum(1 for i in card.mig if i.profile == c.mig_profile)
            # which free instances: one rule for both paths (`core.mig.pick`: partly held
            # cards first, then the fullest), not the first in card order
            held = _Held(r.mig_owner, taken_mig)
            chosen = take(free_instances((r.cards[col] for col in sorted(allowed)),
                                         c.mig_profile, held), c.cards, c.distinct)
            found = [CardShare(card.index, card.uuid, 0, c.mig_profile.memory_gb * 1024,
                               c.mig_profile.name, inst.uuid) for card, inst in chosen]
            taken_mig.update(inst.uuid for _, inst in chosen)
            if len(found) < c.cards and c.distinct:
                return FitFailure(FitKind.MIG_DISTINCT_CARDS, c.mig_profile.resource_name,
                                  c.cards, len(found), profile_cards, Unit.CARDS, c.name,
                                  restricts_models(pod))
            if len(found) < c.cards:
                return FitFailure(FitKind.INSUFFICIENT_MIG, c.mig_profile.resource_name, c.cards,
                                  len(found), profile_total, Unit.INSTANCES, c.name,
                                  restricts_models(pod))
            plan[c.name] = tuple(found)
    return plan


def plan_replicas(lay: Layout, ctx: ScoreContext, row: int, c: ContainerRequest,
                  policy: CardPolicy, view: CardView, cols: list[int], ok: list[bool],
                  untouched: list[bool], used_rep: list[int], pod: PodRequest
                  ) -> tuple[CardShare, ...] | FitFailure | None:
    """A WHOLE container's N units where some served card is time-sliced for the resource
    it wrote (None otherwise: plain whole cards). A time-sliced card gives replica slots
    (r in all, each compute // r milli-cards, no memory); an entirely free plain card
    serving the name gives one whole unit. Each unit goes on a card of its own while
    there is one (the card policy picks as for a share of one slot), then replicas stack.
    Updates the view's free amounts, `untouched` and `used_rep` in place."""
    name = lay.replica_name(c)
    if name is None or not lay.constrained:
        return None
    counts = lay.counts(name)
    cards = view.cards
    rep = [int(counts[row, col]) for col in cols]
    fits = [ok[p] and cards[p].memory_mib >= c.memory_mib for p in range(len(cols))]
    if not any(fits[p] and rep[p] > 1 for p in range(len(cols))):
        return None
    per = [cards[p].compute_milli // rep[p] if rep[p] > 1 else cards[p].compute_milli
           for p in range(len(cols))]

    def slots(p: int) -> int:
        if not fits[p]:
            return 0
        if rep[p] <= 1:
            return int(untouched[p])
        by_milli = view.free_milli[p] // per[p] if per[p] > 0 else rep[p]
        return max(0, min(rep[p] - used_rep[p], by_milli))

    total = sum(slots(p) for p in range(len(cols)))
    if total < c.cards:
        return whole_shortfall(lay, pod, row, c, total)
    taken: dict[int, int] = {}
    for _ in range(c.cards):
        cand = [p for p in range(len(cols)) if p not in taken and slots(p) > 0]
        if not cand:  # more units than cards with room: replicas stack on sliced cards
            cand = [p for p in range(len(cols)) if rep[p] > 1 and slots(p) > 0]
        p = policy.pick_share(ctx, view, cand, per[cand[0]], 0)
        taken[p] = taken.get(p, 0) + 1
        untouched[p] = False
        if rep[p] > 1:
            used_rep[p] += 1
            view.free_milli[p] -= per[p]
        else:
            view.free_milli[p] = view.free_memory[p] = 0
    shares = []
    for p, k in taken.items():
        card = cards[p]
        if rep[p] > 1:
            shares.append(CardShare(card.index, card.uuid, k * per[p], 0, replicas=k))
        else:
            shares.append(CardShare(card.index, card.uuid, card.compute_milli, card.memory_mib))
    return tuple(shares)
