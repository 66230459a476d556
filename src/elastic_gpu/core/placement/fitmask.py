"""Fit as masks over the layout: which nodes can host a pod.

The common requests (one container: a share, N whole cards, or nothing) are a handful of
vectorised comparisons over every node at once; the others are planned node by node.
"""

from __future__ import annotations

import numpy as np

from elastic_gpu.core.fit import FitFailure
from elastic_gpu.core.placement.layout import BoolArray, IntArray, Layout
from elastic_gpu.core.placement.planning import plan
from elastic_gpu.core.policies import CardPolicy, ScoreContext
from elastic_gpu.core.request import PodRequest, RequestKind

#: rows of the layout: every one (a slice), or some, as an array of row numbers
Rows = slice | IntArray
ALL = slice(None)


def host_mask(lay: Layout, pod: PodRequest, check_host: bool, rows: Rows = ALL) -> BoolArray:
    if not check_host:
        return np.ones(len(lay.cpu_cap[rows]), dtype=bool)
    return ((lay.cpu_cap[rows] - lay.cpu_used[rows] >= pod.cpu_milli)
            & (lay.mem_cap[rows] - lay.mem_used[rows] >= pod.memory_mib))

def host_fits(lay: Layout, row: int, pod: PodRequest, check_host: bool) -> bool:
    if not check_host:
        return True
    return bool(lay.cpu_cap[row] - lay.cpu_used[row] >= pod.cpu_milli
                and lay.mem_cap[row] - lay.mem_used[row] >= pod.memory_mib)

def model_ok(lay: Layout, pod: PodRequest, rows: Rows = ALL) -> BoolArray:
    # one spare entry: padding cells of the card matrix hold model id 0 even with no models
    accepted = np.array([pod.accepts_model(m) for m in lay.models] + [False], dtype=bool)
    out: BoolArray = lay.usable[rows] & accepted[lay.card_model[rows]]
    if pod.pins_cards:
        out = out & pinned(lay, pod, rows)
    return out


def pinned(lay: Layout, pod: PodRequest, rows: Rows = ALL) -> BoolArray:
    """Which cards of `rows` the pod accepts by UUID (`PodRequest.accepts_uuid`): only pods
    that name cards pay for this loop."""
    numbers = np.arange(len(lay.rows))[rows]
    out = np.zeros((len(numbers), lay.usable.shape[1]), dtype=bool)
    for i, row in enumerate(numbers):
        for c, card in enumerate(lay.rows[int(row)].cards):
            out[i, c] = pod.accepts_uuid(card.uuid)
    return out


def fit_mask(lay: Layout, ctx: ScoreContext, pod: PodRequest, check_host: bool,
             binpack: CardPolicy, rows: Rows = ALL) -> BoolArray:
    """Which of `rows` (every row by default; else an array of row numbers) can host the pod:
    vectorised for one share or whole-card container, planned per node with the
    tightest-first card policy otherwise. Only the rows asked are read: a request names a
    sample of a large cluster's nodes."""
    host = host_mask(lay, pod, check_host, rows)
    gpu = pod.gpu_containers
    if not gpu:
        return host
    if len(gpu) == 1 and gpu[0].kind in (RequestKind.SHARE, RequestKind.WHOLE):
        c = gpu[0]
        ok = model_ok(lay, pod, rows)
        offer = lay.offer_mask(c.served_names)
        if offer is not None:
            ok = ok & offer[rows]
        if c.kind is RequestKind.SHARE:
            cards = (ok & (lay.cap_milli[rows] - lay.used_milli[rows] >= lay.share_need(c, rows))
                     & (lay.free_mem(rows) >= c.memory_mib))
            # N distinct cards with room each (one for the usual share)
            share_ok: BoolArray = host & (cards.any(axis=1) if c.cards == 1
                                          else cards.sum(axis=1) >= c.cards)
            return share_ok
        whole_ok: BoolArray = host & (lay.whole_slots(c, ok, rows).sum(axis=1) >= c.cards)
        return whole_ok
    numbers = np.arange(len(lay.rows))[rows]
    out = host.copy()
    for i in np.flatnonzero(host):
        out[i] = not isinstance(plan(lay, ctx, int(numbers[i]), pod, binpack), FitFailure)
    return out
