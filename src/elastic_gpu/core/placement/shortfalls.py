"""Why a container does not fit a node's cards: the failures planning and fit explanations share.

Each builds the `FitFailure` a refusal states (`fit.describe` makes the sentence at the edge);
planning (which finds the shortfall while choosing cards) and the vectorised explanations (which
find it from the arrays) must say the same thing, so they build it here, once.
"""

from __future__ import annotations

from elastic_gpu.core.fit import FitFailure, FitKind, Unit
from elastic_gpu.core.placement.layout import Layout
from elastic_gpu.core.request import ContainerRequest, PodRequest
from elastic_gpu.core.tflops import card_tflops


def restricts_models(pod: PodRequest) -> bool:
    """Card counts in a failure are among the accepted models only (the sentence says so)."""
    return pod.allowed_models is not None or bool(pod.denied_models)



def whole_shortfall(lay: Layout, pod: PodRequest, row: int, c: ContainerRequest, count: int
                    ) -> FitFailure:
    """Too few whole-card units: entirely free cards, or time-sliced replica slots where
    the node's cards are time-sliced for the name the container wrote."""
    n = len(lay.rows[row].cards)
    name = lay.replica_name(c)
    if name is not None and lay.constrained and (lay.counts(name)[row, :n] > 1).any():
        total = int(lay.counts(name)[row, :n].sum())
        return FitFailure(FitKind.INSUFFICIENT_REPLICAS, name, c.cards, count, total,
                          Unit.REPLICAS, c.name, restricts_models(pod))
    return cards_failure(pod, c, count, n)



def share_failure(pod: PodRequest, c: ContainerRequest, cards: int,
                  milli: int | None = None, free: int = 0) -> FitFailure:
    """Too few cards have the share's compute and memory free: `free` of `cards` cards, the
    share asks `c.cards` (1, or N distinct cards for a multi-card share); `milli` the compute
    it needs where that depends on the card (a TFLOPS share: the least of its cards)."""
    return FitFailure(FitKind.INSUFFICIENT_SHARE, c.resources[0] if c.resources else "",
                      c.cards, free, cards, Unit.CARDS, c.name, restricts_models(pod),
                      per_card_milli=c.compute_milli if milli is None else milli,
                      per_card_mib=c.memory_mib)


def tflops_failure(lay: Layout, pod: PodRequest, row: int, c: ContainerRequest,
                   cols: list[int]) -> FitFailure | None:
    """Why a TFLOPS share fits none of the cards `cols` whatever they hold: none is of a model
    the TFLOPS table knows, or the request is more than each known model's whole card."""
    if not c.tflops:
        return None
    models = sorted({lay.rows[row].cards[col].model for col in cols})
    known = [t for m in models if (t := card_tflops(m)) is not None]
    resource = c.resources[0] if c.resources else ""
    if not known:
        return FitFailure(FitKind.TFLOPS_UNKNOWN_MODEL, resource, c.tflops, unit=Unit.TFLOPS,
                          container=c.name, among_accepted_models=restricts_models(pod),
                          offered=tuple(models))
    if max(known) < c.tflops:
        return FitFailure(FitKind.TFLOPS_ABOVE_CARD, resource, c.tflops, capacity=max(known),
                          unit=Unit.TFLOPS, container=c.name,
                          among_accepted_models=restricts_models(pod), offered=tuple(models))
    return None


def least_need(lay: Layout, row: int, c: ContainerRequest, cols: list[int]) -> int:
    """The least compute the share needs of any of the cards `cols` (for messages)."""
    needs = [m for col in cols
             if (m := c.milli_on(lay.rows[row].cards[col].model)) is not None]
    return min(needs, default=c.compute_milli)



def cards_failure(pod: PodRequest, c: ContainerRequest, free: int, cards: int) -> FitFailure:
    """Too few entirely free cards: `free` of `cards`."""
    return FitFailure(FitKind.INSUFFICIENT_CARDS, c.resources[0] if c.resources else "",
                      c.cards, free, cards, Unit.CARDS, c.name, restricts_models(pod))



def out_of_band_share(lay: Layout, pod: PodRequest, row: int, c: ContainerRequest,
                      ok: list[bool], cols: list[int], free_milli: list[int],
                      free_mem: list[int]) -> FitFailure | None:
    """Why a share fits no card when out-of-band memory is the cause: the first card (of
    positions `ok` into `cols`, with this pod's free amounts) that has the share's compute
    and would have its memory but for the memory its node observes used out of band."""
    for p, col in enumerate(cols):
        oob = int(lay.oob_mem[row, col])
        need = c.milli_on(lay.rows[row].cards[col].model)
        if (ok[p] and oob > 0 and need is not None and free_milli[p] >= need
                and free_mem[p] < c.memory_mib <= free_mem[p] + oob):
            return out_of_band(lay, pod, row, col, c, free_mem[p])
    return None


def out_of_band_whole(lay: Layout, pod: PodRequest, row: int, c: ContainerRequest,
                      ok: list[bool], cols: list[int], untouched: list[bool],
                      free: int) -> FitFailure | None:
    """Why too few whole cards are free when out-of-band memory is the cause: `free` whole
    cards were found and cards that are free by the ledger but hold out-of-band memory would
    make up the rest; names the first of those."""
    blocked = [col for p, col in enumerate(cols)
               if ok[p] and not untouched[p] and lay.oob_mem[row, col] > 0
               and lay.used_milli[row, col] == 0 and lay.used_mem[row, col] == 0
               and lay.cap_mem[row, col] >= c.memory_mib]
    if not blocked or free + len(blocked) < c.cards:
        return None
    return out_of_band(lay, pod, row, blocked[0], c, None)


def out_of_band(lay: Layout, pod: PodRequest, row: int, col: int, c: ContainerRequest,
                free_mib: int | None) -> FitFailure:
    """The OUT_OF_BAND_MEMORY failure of one card: for a share (`free_mib` what is left of
    its memory), or for whole cards (`free_mib` None)."""
    card = lay.rows[row].cards[col]
    oob = int(lay.oob_mem[row, col])
    resource = c.resources[0] if c.resources else ""
    if free_mib is None:
        return FitFailure(FitKind.OUT_OF_BAND_MEMORY, resource, c.cards,
                          int(card.memory_mib - lay.used_mem[row, col]) - oob, card.memory_mib,
                          Unit.CARDS, c.name, restricts_models(pod), card=card.index,
                          out_of_band_mib=oob)
    return FitFailure(FitKind.OUT_OF_BAND_MEMORY, resource, c.memory_mib, free_mib,
                      card.memory_mib, Unit.MIB, c.name, restricts_models(pod),
                      per_card_milli=c.milli_on(card.model) or 0, per_card_mib=c.memory_mib,
                      card=card.index, out_of_band_mib=oob)
