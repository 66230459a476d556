"""Fit as masks over the layout: which nodes can host a pod.

The common requests (one container: a share, N whole cards, or nothing) are a handful of
vectorised comparisons over every node at once; the others are planned node by node.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from elastic_gpu.core.fit import FitFailure
from elastic_gpu.core.placement.layout import BoolArray, IntArray, Layout
from elastic_gpu.core.placement.planning import plan
from elastic_gpu.core.policies import CardPolicy, ScoreContext
from elastic_gpu.core.request import PodRequest, RequestKind

#: rows of the layout: every one (a slice), or some, as an array of row numbers
Rows = slice | IntArray
ALL = slice(None)
#: fit masks kept (`FitMasks`): the requests of a burst of pods are mostly of a few shapes
FIT_MASKS_KEPT = 16


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
    if _vectorised(pod):
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


def _vectorised(pod: PodRequest) -> bool:
    gpu = pod.gpu_containers
    return not gpu or (len(gpu) == 1 and gpu[0].kind in (RequestKind.SHARE, RequestKind.WHOLE))


def fit_key(pod: PodRequest, check_host: bool) -> Hashable:
    """What a pod's fit mask depends on. Pods that differ only in name or, where host
    resources are not checked (the extender: kube-scheduler checks them), only in CPU and
    memory have one mask: pods that each ask their own CPU are not each a new computation
    over every node. A request `fit_mask` plans node by node keeps its host requests in the
    key (the card policy's view holds its task shape)."""
    host = (pod.cpu_milli, pod.memory_mib) if check_host or not _vectorised(pod) else None
    return (pod.containers, pod.allowed_models, pod.denied_models, pod.allowed_cards,
            pod.denied_cards, host)


@dataclass
class _Kept:
    mask: BoolArray
    epoch: int
    change: int


class FitMasks:
    """The whole-cluster fit masks of the latest requests (`fit_key`), each brought up to
    date by recomputing only the rows changed since it was last asked (`Layout.touch`): a
    bind changes one node, so the next pod's mask is a few rows' work, not every node's."""

    def __init__(self, size: int = FIT_MASKS_KEPT) -> None:
        self._size = size
        #: insertion order is recency (a hit is moved to the end)
        self._kept: dict[Hashable, _Kept] = {}

    def holds(self, lay: Layout, key: Hashable) -> bool:
        """Whether a mask is kept for `key` that can be brought up to date (not computed anew)."""
        kept = self._kept.get(key)
        return (kept is not None and kept.epoch == lay.epoch
                and lay.changed_since(kept.change) is not None)

    def mask(self, lay: Layout, ctx: ScoreContext, pod: PodRequest, check_host: bool,
             binpack: CardPolicy) -> BoolArray:
        """`fit_mask` of every row, as things are now. Callers must not mutate it; a later
        call returns a new array where rows changed meanwhile."""
        key = fit_key(pod, check_host)
        kept = self._kept.pop(key, None)
        changed = (lay.changed_since(kept.change)
                   if kept is not None and kept.epoch == lay.epoch else None)
        if kept is None or changed is None:
            if len(self._kept) >= self._size:
                del self._kept[next(iter(self._kept))]  # the least recently used
            kept = _Kept(fit_mask(lay, ctx, pod, check_host, binpack), lay.epoch, lay.changes)
        elif changed.size:
            # a few rows (a bind changes its node two or three times): a set beats np.unique
            rows = (np.unique(changed) if changed.size > 64 else
                    np.fromiter(sorted(set(changed.tolist())), dtype=np.int64))
            mask = kept.mask.copy()
            mask[rows] = fit_mask(lay, ctx, pod, check_host, binpack, rows)
            kept = _Kept(mask, lay.epoch, lay.changes)
        self._kept[key] = kept
        return kept.mask
