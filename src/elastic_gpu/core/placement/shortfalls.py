"""Why a container does not fit a node's cards: the failures planning and fit explanations share.

Each builds the `FitFailure` a refusal states (`fit.describe` makes the sentence at the edge);
planning (which finds the shortfall while choosing cards) and the vectorised explanations (which
find it from the arrays) must say the same thing, so they build it here, once.
"""

from __future__ import annotations

from elastic_gpu.core.fit import FitFailure, FitKind, Unit
from elastic_gpu.core.placement.layout import Layout
from elastic_gpu.core.request import ContainerRequest, PodRequest


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



def share_failure(pod: PodRequest, c: ContainerRequest, cards: int) -> FitFailure:
    """No card has the share's compute and memory free (one of `cards` cards)."""
    return FitFailure(FitKind.INSUFFICIENT_SHARE, c.resources[0] if c.resources else "", 1, 0,
                      cards, Unit.CARDS, c.name, restricts_models(pod),
                      per_card_milli=c.compute_milli, per_card_mib=c.memory_mib)



def cards_failure(pod: PodRequest, c: ContainerRequest, free: int, cards: int) -> FitFailure:
    """Too few entirely free cards: `free` of `cards`."""
    return FitFailure(FitKind.INSUFFICIENT_CARDS, c.resources[0] if c.resources else "",
                      c.cards, free, cards, Unit.CARDS, c.name, restricts_models(pod))
