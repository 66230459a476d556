"""Topology-aware choice of cards for multi-card requests.

The weight of a set of cards is the sum of the link weights between every pair in it
(`Link.weight`: kind weight times lane count; pairs with no reported link count as SYSTEM).
We want the heaviest set of the requested size among the free cards. Nodes have at most a few
dozen cards and requests a handful, so an exact search is affordable up to a bound; beyond it a
greedy growth from every seed card is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import comb

from elastic_gpu.core.model import LINK_WEIGHT, Card, LinkKind

#: exact search up to this many candidate sets
EXACT_LIMIT = 5000


def pair_weight(a: Card, b: Card) -> int:
    best = 0
    for link in a.links:
        if link.peer == b.index:
            best = max(best, link.weight)
    for link in b.links:
        if link.peer == a.index:
            best = max(best, link.weight)
    if best == 0:
        if a.board is not None and a.board == b.board:
            return LINK_WEIGHT[LinkKind.SAME_BOARD]
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return LINK_WEIGHT[LinkKind.NUMA]
        return LINK_WEIGHT[LinkKind.SYSTEM]
    return best


def set_weight(cards: Sequence[Card], positions: Sequence[int]) -> int:
    return sum(pair_weight(cards[i], cards[j]) for i, j in combinations(positions, 2))


def best_linked_set(cards: Sequence[Card], candidates: Sequence[int], count: int) -> list[int]:
    """Positions (into `cards`) of `count` candidates with the strongest links among them;
    ties: the lowest card indexes."""
    ordered = sorted(candidates, key=lambda p: cards[p].index)
    if count >= len(ordered):
        return ordered
    if comb(len(ordered), count) <= EXACT_LIMIT:
        best = max(combinations(ordered, count),
                   key=lambda s: (set_weight(cards, s), [-cards[p].index for p in s]))
        return list(best)
    chosen: list[int] = []
    best_weight = -1
    for seed in ordered:
        group = [seed]
        while len(group) < count:
            rest = [p for p in ordered if p not in group]
            nxt = max(rest, key=lambda p: (sum(pair_weight(cards[p], cards[q]) for q in group),
                                          -cards[p].index))
            group.append(nxt)
        weight = set_weight(cards, group)
        if weight > best_weight:
            chosen, best_weight = sorted(group, key=lambda p: cards[p].index), weight
    return chosen
