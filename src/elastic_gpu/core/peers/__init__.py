"""Peers' dialects: HAMi's, Volcano's, KAI's and Koordinator's GPU requests, read as ours.

Each module is a pure translator from a peer's manifest (a plain dict) to our canonical
request (`Ask`: N cards, each a share of `percent` compute and `memory_mib`, or N whole
cards) and our annotations, or to a `PeerRefusal` naming the peer's field:
- `vgpu`: the vGPU vocabulary HAMi (`nvidia.com/gpumem`...) and Volcano
  (`volcano.sh/vgpu-*`) share;
- `hami`: HAMi's (and Volcano's) pod annotations: card types, card UUIDs, policies, MIG mode;
- `kai`: KAI's annotations (`gpu-fraction`, `gpu-memory`, `gpu-fraction-num-devices`);
- `koordinator`: Koordinator's `koordinator.sh/gpu-*` resources.
`core.admission.peers` applies them at create, before the admission rules, so the rest of
the system sees only our dialect (docs/coming-from/).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import GPU_CORE, GPU_MEMORY, GPU_WHOLE, PERCENT_PER_CARD


@dataclass(frozen=True)
class PeerFacts:
    """What a translation needs of the cluster: card memory (0: no GPU node known), the card
    models and UUIDs some node has (None: not known)."""

    smallest_card_memory_mib: int = 0
    largest_card_memory_mib: int = 0
    models: frozenset[str] = frozenset()
    card_uuids: frozenset[str] | None = None


@dataclass(frozen=True)
class PeerRefusal:
    """A peer's field we cannot honour: its name, its value as written, why."""

    field: str
    value: str
    detail: str
    container: str = ""


@dataclass(frozen=True)
class Ask:
    """One container's request in our units: `cards` cards, each exclusive (`whole`) or a
    share of `percent` compute (0-99) and `memory_mib` memory."""

    cards: int
    percent: int = 0
    memory_mib: int = 0
    whole: bool = False

    def resources(self) -> dict[str, str]:
        """Our resource names for it: `elasticgpu.io/gpu: N` for whole cards; one share as
        `gpu-core`/`gpu-memory`; N > 1 shares as `elasticgpu.io/gpu: N` beside one share
        (with at least 1 % compute: the multi-card share dialect names a compute share)."""
        if self.whole:
            return {GPU_WHOLE: str(self.cards)}
        out: dict[str, str] = {}
        percent = self.percent
        if self.cards > 1:
            out[GPU_WHOLE] = str(self.cards)
            percent = max(percent, 1)
        if percent:
            out[GPU_CORE] = str(percent)
        if self.memory_mib:
            out[GPU_MEMORY] = str(self.memory_mib)
        return out


@dataclass(frozen=True)
class Rewrite:
    """What one container becomes: the peer names it loses (from limits and requests) and
    the resources it gains (in limits, and in requests where it had peer names there)."""

    container: str
    remove: tuple[str, ...] = ()
    add: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Translation:
    """A pod's translation: container rewrites, our annotations to set, refusals."""

    rewrites: tuple[Rewrite, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    refusals: tuple[PeerRefusal, ...] = ()

    def __add__(self, other: Translation) -> Translation:
        return Translation(self.rewrites + other.rewrites,
                           {**self.annotations, **other.annotations},
                           self.refusals + other.refusals)


def whole_number(name: str, raw: Any, container: str = "", *, most: int | None = None,
                 least: int = 0) -> int | PeerRefusal:
    """A peer's value as a whole number in [least, most], or the refusal naming its field."""
    try:
        value = parse_quantity(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) \
            else None
    except QuantityError:
        value = None
    if value is None or value.denominator != 1:
        return PeerRefusal(name, str(raw), "must be a whole number", container)
    number = int(value)
    if number < least:
        return PeerRefusal(name, str(raw), f"must be at least {least}", container)
    if most is not None and number > most:
        return PeerRefusal(name, str(raw), f"must be at most {most}", container)
    return number


def percent_of(mib: int, percent: int) -> int:
    """`percent` % of `mib`, rounded down (never more than the card has)."""
    return mib * percent // PERCENT_PER_CARD


def exclusive(percent: int, memory_percent: int) -> bool:
    """HAMi's rule, which Koordinator's proposal shares: 100 % of the compute, or all of the
    memory with no compute named, is the card exclusively."""
    return percent == PERCENT_PER_CARD or (memory_percent == PERCENT_PER_CARD and not percent)


def over_largest(name: str, raw: Any, mib: int, facts: PeerFacts,
                 container: str = "") -> PeerRefusal | None:
    """The refusal of `mib` per card above the largest card the cluster has (None: it fits,
    or no GPU node is known yet)."""
    largest = facts.largest_card_memory_mib
    if mib and largest and mib > largest:
        return PeerRefusal(name, str(raw), f"more memory per card than the largest card has "
                           f"({largest} MiB)", container)
    return None


def memory_of_smallest(name: str, raw: Any, percent: int, facts: PeerFacts, instead: str,
                       container: str = "") -> int | PeerRefusal:
    """`percent` % of the cluster's smallest card in MiB (our shares are MiB, the same on
    every card), or the refusal naming `name` while no GPU node is known (`instead`: the
    peer's field to give instead)."""
    if not facts.smallest_card_memory_mib:
        return PeerRefusal(name, str(raw), "memory in percent is sized on the cluster's "
                           f"smallest card, and no GPU node is known yet; give {instead}",
                           container)
    return percent_of(facts.smallest_card_memory_mib, percent)


def peer_rewrite(name: str, written: tuple[str, ...], ask: Ask | list[PeerRefusal]
                 ) -> Rewrite | list[PeerRefusal]:
    """A container's rewrite from its peer names `written` to `ask` (or its refusals)."""
    if isinstance(ask, list):
        return ask
    return Rewrite(name, written, ask.resources())


def merged_resources(container: Mapping[str, Any]) -> dict[str, Any]:
    """A container's requests overlaid with its limits (limits win, as `core.request`)."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    out: dict[str, Any] = {}
    for part in ("requests", "limits"):
        values = resources.get(part)
        if isinstance(values, Mapping):
            out.update(values)
    return out
