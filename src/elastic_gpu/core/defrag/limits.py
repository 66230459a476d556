"""How many moves the defragmentation controller may make, and when. Pure.

A plan is carried out whole or not at all (half a plan evicts pods and frees nothing), so the
rate limits are asked of a plan's moves together: within the sliding window, at most
`per_node` evictions from any one node and `cluster` in all, the plan's moves included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RateLimits:
    #: evictions from one node within the window
    per_node: int = 2
    #: evictions in the whole cluster within the window
    cluster: int = 10
    window_s: float = 600.0


@dataclass(frozen=True)
class Eviction:
    """One eviction made: when (a monotonic clock) and from which node."""

    at: float
    node: str


def recent(history: Iterable[Eviction], now: float, limits: RateLimits) -> list[Eviction]:
    """The evictions still inside the window (the ones the limits count)."""
    return [e for e in history if now - e.at < limits.window_s]


def over_limit(source_nodes: Sequence[str], history: Iterable[Eviction], now: float,
               limits: RateLimits) -> str | None:
    """None when evictions from `source_nodes` (one per move, a node repeated per move) may
    all be made now; else the sentence saying which limit they would pass."""
    window = recent(history, now, limits)
    if len(window) + len(source_nodes) > limits.cluster:
        return (f"{len(source_nodes)} move(s) would pass the cluster limit of {limits.cluster} "
                f"per {limits.window_s:g} s ({len(window)} made)")
    made = Counter(e.node for e in window)
    planned = Counter(source_nodes)
    for node in sorted(planned):
        if made[node] + planned[node] > limits.per_node:
            return (f"{planned[node]} move(s) from node {node} would pass the per-node limit "
                    f"of {limits.per_node} per {limits.window_s:g} s ({made[node]} made)")
    return None
