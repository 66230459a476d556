"""Why a pod does not fit: one node's first failing check, and the summary over all nodes.

The checks run in one order (host CPU and memory, healthy cards, accepted models, offered
resources, then the cards themselves), and a node is explained by the first that fails, so a
refusal names the cause an operator can act on first. `unschedulable` counts every node by that
first check, vectorised: it runs for each failed task of a replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.fit import FitFailure, FitKind, NoNodeFits, Unit, Unschedulable
from elastic_gpu.core.model import Health
from elastic_gpu.core.placement.fitmask import pinned
from elastic_gpu.core.placement.layout import BoolArray, Layout
from elastic_gpu.core.placement.planning import plan
from elastic_gpu.core.placement.shortfalls import (
    cards_failure,
    least_need,
    out_of_band_share,
    out_of_band_whole,
    share_failure,
    tflops_failure,
    whole_shortfall,
)
from elastic_gpu.core.policies import CardPolicy, ScoreContext
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MIG_PREFIX
from elastic_gpu.core.tflops import card_tflops

#: a node that fit says no to and `why_not` cannot explain (never expected; honest if it is)
UNDETAILED = FitFailure(FitKind.UNDETAILED)


def why_not(lay: Layout, ctx: ScoreContext, check_host: bool, binpack: CardPolicy, row: int,
            pod: PodRequest) -> FitFailure | None:
    """Why the pod does not fit on this row (the first failing check), or None if it fits."""
    r = lay.rows[row]
    if check_host:
        cpu_free = int(lay.cpu_cap[row] - lay.cpu_used[row])
        if cpu_free < pod.cpu_milli:
            return FitFailure(FitKind.HOST_CPU, "cpu", pod.cpu_milli, cpu_free,
                              int(lay.cpu_cap[row]), Unit.MILLI_CPU)
        mem_free = int(lay.mem_cap[row] - lay.mem_used[row])
        if mem_free < pod.memory_mib:
            return FitFailure(FitKind.HOST_MEMORY, "memory", pod.memory_mib, mem_free,
                              int(lay.mem_cap[row]), Unit.MIB)
    gpu = pod.gpu_containers
    if not gpu:
        return None
    if not any(lay.usable[row, c] or r.cards[c].mig_enabled for c in range(len(r.cards))):
        fenced = sum(1 for card in r.cards if card.health is Health.FENCED)
        if fenced:  # healthy cards whose MIG layout is being changed (docs/mig-apply.md)
            return FitFailure(FitKind.CARD_FENCED, requested=fenced, capacity=len(r.cards),
                              unit=Unit.CARDS)
        return FitFailure(FitKind.NO_HEALTHY_GPU, capacity=len(r.cards), unit=Unit.CARDS)
    models = {r.cards[c].model for c in range(len(r.cards))}
    if not any(pod.accepts_model(m) for m in models):
        return FitFailure(FitKind.MODEL_NOT_ACCEPTED, offered=tuple(sorted(models)),
                          allowed=(tuple(sorted(pod.allowed_models))
                                   if pod.allowed_models is not None else None),
                          denied=tuple(sorted(pod.denied_models)))
    if pod.pins_cards and not any(pod.accepts_card(card) for card in r.cards):
        return FitFailure(FitKind.CARD_NOT_PINNED, capacity=len(r.cards), unit=Unit.CARDS)
    unknown = unknown_tflops_model(lay, row, pod)
    if unknown is not None:
        return unknown  # before the offers: it is why such a node advertises no TFLOPS
    missing = missing_offer(lay, row, gpu)
    if missing is not None:
        return missing
    if len(gpu) == 1 and gpu[0].kind in (RequestKind.SHARE, RequestKind.WHOLE):
        # What `_plan` would say for one share or whole-card container, from the arrays
        # (the extender explains failed nodes per request; planning each costs ~0.1 ms).
        c = gpu[0]
        n = len(r.cards)
        ok = lay.usable[row, :n] & np.array([pod.accepts_card(card) for card in r.cards],
                                               dtype=bool)
        offer = lay.offer_mask(c.served_names)
        if offer is not None:
            ok = ok & offer[row, :n]
        free_milli = lay.cap_milli[row, :n] - lay.used_milli[row, :n]
        free_mem = lay.free_mem(slice(row, row + 1))[0, :n]
        if c.kind is RequestKind.SHARE:
            need = lay.share_need(c, slice(row, row + 1))
            need = need[0, :n] if not isinstance(need, int) else need
            cand = ok & (free_milli >= need) & (free_mem >= c.memory_mib)
            room = int(cand.sum())
            if room >= c.cards:
                return None
            cols = [int(col) for col in np.flatnonzero(ok)]
            return (tflops_failure(lay, pod, row, c, cols)
                    or (out_of_band_share(lay, pod, row, c, ok.tolist(), list(range(n)),
                                          free_milli.tolist(), free_mem.tolist())
                        if room == 0 else None)
                    or share_failure(pod, c, n, least_need(lay, row, c, cols), room))
        cells = np.zeros((1, lay.usable.shape[1]), dtype=bool)
        cells[0, :n] = ok
        count = int(lay.whole_slots(c, cells, slice(row, row + 1)).sum())
        if count >= c.cards:
            return None
        untouched = ((lay.used_milli[row, :n] == 0) & (lay.used_mem[row, :n] == 0)
                     & (lay.oob_mem[row, :n] == 0))
        return (out_of_band_whole(lay, pod, row, c, ok.tolist(), list(range(n)),
                                  untouched.tolist(), count)
                or whole_shortfall(lay, pod, row, c, count))
    planned = plan(lay, ctx, row, pod, binpack)
    return planned if isinstance(planned, FitFailure) else None


def why_not_rows(lay: Layout, ctx: ScoreContext, check_host: bool, binpack: CardPolicy,
                 rows: Sequence[int], pod: PodRequest) -> list[FitFailure | None]:
    """`why_not` of each of `rows`, the same answers, made in one pass over the arrays for the
    common requests (one share or whole-card container, no host checks, TFLOPS or offer
    constraints): the extender explains up to `DETAIL_LIMIT` failed nodes per filter, and
    per node `why_not` costs more than the whole cluster's fit mask.

    Nodes that fail alike share one failure object, made once: for these requests a node
    past the node-level checks fails on numbers the failure holds (free cards of how many,
    or the share's need), so equal numbers are an equal failure (and `verbs` makes its
    sentence once per object). Nodes that fail a node-level check or hold out-of-band
    memory are rare and their failures name more of the node: they are asked `why_not`."""
    gpu = pod.gpu_containers
    if (check_host or lay.constrained or len(rows) == 0 or len(gpu) != 1 or pod.pins_cards
            or gpu[0].kind not in (RequestKind.SHARE, RequestKind.WHOLE) or gpu[0].tflops):
        return [why_not(lay, ctx, check_host, binpack, row, pod) for row in rows]
    c = gpu[0]
    at = np.asarray(rows, dtype=np.int64)
    accepted = np.array([pod.accepts_model(m) for m in lay.models] + [False], dtype=bool)
    ok = lay.usable[at] & accepted[lay.card_model[at]]
    # `why_not`'s node-level checks, and the out-of-band explanations, in its own words
    asked_alone = (~(lay.usable[at] | lay.mig_card[at]).any(axis=1)
                   | ~(lay.exists[at] & accepted[lay.card_model[at]]).any(axis=1)
                   | (lay.oob_mem[at] > 0).any(axis=1))
    cards = lay.exists[at].sum(axis=1)
    if c.kind is RequestKind.SHARE:
        counts = (ok & (lay.cap_milli[at] - lay.used_milli[at] >= c.compute_milli)
                  & (lay.free_mem(at) >= c.memory_mib)).sum(axis=1)
        fits = counts >= c.cards
        # a non-TFLOPS share needs its compute_milli of every card (`least_need`); the cards
        # with room (0 for a one-card share that fails) are part of a multi-card share's failure
        numbers = counts * (int(cards.max()) + 1) + cards
    else:
        counts = lay.whole_slots(c, ok, at).sum(axis=1)
        fits = counts >= c.cards
        numbers = counts * (int(cards.max()) + 1) + cards
    made: dict[int, FitFailure] = {}
    out: list[FitFailure | None] = []
    for i, (row, alone, fit, number) in enumerate(zip(
            rows, asked_alone.tolist(), fits.tolist(), numbers.tolist(), strict=True)):
        if alone:
            out.append(why_not(lay, ctx, check_host, binpack, row, pod))
        elif fit:
            out.append(None)
        else:
            failure = made.get(number)
            if failure is None:
                failure = made[number] = (
                    share_failure(pod, c, int(cards[i]), c.compute_milli, int(counts[i]))
                    if c.kind is RequestKind.SHARE
                    else cards_failure(pod, c, int(counts[i]), int(cards[i])))
            out.append(failure)
    return out


def unknown_tflops_model(lay: Layout, row: int, pod: PodRequest) -> FitFailure | None:
    """A TFLOPS container's failure where none of the node's cards the pod accepts is of a
    model the TFLOPS table knows (`unschedulable` checks the same, in the same order)."""
    cards = lay.rows[row].cards
    cols = [col for col in range(len(cards)) if pod.accepts_card(cards[col])]
    for c in pod.gpu_containers:
        failure = tflops_failure(lay, pod, row, c, cols)
        if failure is not None and failure.kind is FitKind.TFLOPS_UNKNOWN_MODEL:
            return failure
    return None


def mig_dynamic_anywhere(lay: Layout) -> bool:
    """Whether some node is opted in to dynamic MIG (its label `elasticgpu.io/mig-dynamic`):
    a MIG profile no node offers may then be carved for the pod. Made once per layout
    rebuild (a label change rebuilds it): the extender explains up to 16 nodes a filter."""
    if lay.mig_dynamic is None:
        lay.mig_dynamic = any(r.node.labels.get(MIG_DYNAMIC_LABEL) == "true" for r in lay.rows)
    return lay.mig_dynamic


def missing_offer(lay: Layout, row: int, gpu: Sequence[ContainerRequest]) -> FitFailure | None:
    """Why the node serves no container's resource at all (vendor, name), if so: the
    first written name no card of the node offers."""
    if not lay.constrained:
        return None
    r = lay.rows[row]
    n = len(r.cards)
    for c in gpu:
        for res in c.served_names:
            if not (lay.counts(res)[row, :n] > 0).any():
                return FitFailure(FitKind.RESOURCE_NOT_OFFERED, res, capacity=n,
                                  unit=Unit.CARDS, container=c.name,
                                  offered=lay.offered_names(row),
                                  no_mig_dynamic=(res.startswith(MIG_PREFIX)
                                                  and not mig_dynamic_anywhere(lay)))
        offer = lay.offer_mask(c.served_names)
        if offer is not None and not offer[row, :n].any():
            return FitFailure(FitKind.RESOURCE_NOT_OFFERED, " and ".join(c.served_names),
                              capacity=n, unit=Unit.CARDS, container=c.name,
                              offered=lay.offered_names(row))
    return None


def unschedulable(lay: Layout, ctx: ScoreContext, check_host: bool, binpack: CardPolicy,
                  pod: PodRequest) -> Unschedulable:
    """Why no node fits, nodes counted by the category of their first failing check, in
    `_why_not`'s order (vectorised: this runs for every failed task of a replay)."""
    n = len(lay.rows)
    left = np.ones(n, dtype=bool)
    counts: dict[str, int] = {}
    example: dict[str, int] = {}
    last: list[str] = []  # the categories in check order, as they rule nodes out

    def take(category: str, mask: BoolArray) -> None:
        hit = np.flatnonzero(left & mask)
        if hit.size:
            counts[category] = counts.get(category, 0) + int(hit.size)
            example.setdefault(category, int(hit[0]))
            left[hit] = False
            last.append(category)

    if check_host:
        take(FitKind.HOST_CPU.category, lay.cpu_cap - lay.cpu_used < pod.cpu_milli)
        take(FitKind.HOST_MEMORY.category, lay.mem_cap - lay.mem_used < pod.memory_mib)
    if pod.gpu_containers:
        take(FitKind.NO_HEALTHY_GPU.category,
             np.logical_not((lay.usable | lay.mig_card).any(axis=1)))
        accepted = np.array([pod.accepts_model(m) for m in lay.models] + [False], dtype=bool)
        has_model: BoolArray = (lay.exists & accepted[lay.card_model]).any(axis=1)
        take(FitKind.MODEL_NOT_ACCEPTED.category, ~has_model)
        if pod.pins_cards:
            take(FitKind.CARD_NOT_PINNED.category,
                 ~(lay.exists & accepted[lay.card_model] & pinned(lay, pod)).any(axis=1))
        if any(c.tflops for c in pod.gpu_containers):
            # a TFLOPS share needs a card of a model the TFLOPS table knows
            in_table = np.array([card_tflops(m) is not None for m in lay.models] + [False],
                                dtype=bool)
            take(FitKind.TFLOPS_UNKNOWN_MODEL.category,
                 ~(lay.exists & accepted[lay.card_model] & in_table[lay.card_model]).any(axis=1))
        if lay.constrained:
            no_offer = np.zeros(n, dtype=bool)
            for c in pod.gpu_containers:
                offer = lay.offer_mask(c.served_names)
                if offer is not None:
                    no_offer |= ~offer.any(axis=1)
            take(FitKind.RESOURCE_NOT_OFFERED.category, no_offer)
        kinds = {c.kind for c in pod.gpu_containers}
        take(FitKind.INSUFFICIENT_MIG.category if kinds == {RequestKind.MIG}
             else FitKind.INSUFFICIENT_CARDS.category, left.copy())
    ordered = tuple(sorted(counts.items(), key=lambda kv: -kv[1]))
    category = ordered[0][0] if ordered else FitKind.UNKNOWN_NODE.category
    row = example.get(category)
    why = why_not(lay, ctx, check_host, binpack, row, pod) if row is not None else None
    summary = NoNodeFits(pod.key, n, ordered, category,
                         lay.rows[row].node.name if row is not None else None, why,
                         last[-1] if last else category)
    return Unschedulable(why or UNDETAILED, summary.example_node, summary)
