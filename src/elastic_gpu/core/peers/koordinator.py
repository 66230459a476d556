"""Koordinator's GPU resources (its GPU Share API proposal, docs/proposals/scheduling/
20230802-gpu-share-api in koordinator-sh/koordinator), read as ours.

- `koordinator.sh/gpu-core`: percent of a card's compute (100 per card);
- `koordinator.sh/gpu-memory-ratio`: percent of a card's memory; here MiB of the cluster's
  smallest card (Koordinator sizes it per node);
- `koordinator.sh/gpu-memory`: memory as a quantity of bytes (`8Gi`), rounded up to MiB;
- `koordinator.sh/gpu`: compute and memory ratio together (`50` = half of both; deprecated);
- `koordinator.sh/gpu.shared: N`: the pod's values are a total, divided evenly over N cards
  (`gpu-core: 100, gpu-memory: 4Gi, gpu.shared: 2` = two cards, 50 % and 2 GiB each).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from elastic_gpu.core.peers import (
    Ask,
    PeerFacts,
    PeerRefusal,
    Rewrite,
    exclusive,
    memory_of_smallest,
    merged_resources,
    over_largest,
    peer_rewrite,
    whole_number,
)
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import PERCENT_PER_CARD

CORE = "koordinator.sh/gpu-core"
MEMORY = "koordinator.sh/gpu-memory"
RATIO = "koordinator.sh/gpu-memory-ratio"
BOTH = "koordinator.sh/gpu"
SHARED = "koordinator.sh/gpu.shared"
PEER_RESOURCE_NAMES = (CORE, MEMORY, RATIO, BOTH, SHARED)
MIB = Fraction(2**20)


def _memory_mib(raw: Any, container: str) -> int | PeerRefusal:
    try:
        value = parse_quantity(raw) if isinstance(raw, (str, int)) else Fraction(-1)
    except QuantityError:
        value = Fraction(-1)
    if value < 0:
        return PeerRefusal(MEMORY, str(raw), "is a quantity of bytes such as 8Gi", container)
    quotient = value / MIB
    return -(-quotient.numerator // quotient.denominator)


def koordinator_ask(values: Mapping[str, Any], facts: PeerFacts,
                    container: str = "") -> Ask | list[PeerRefusal]:
    """What Koordinator's names in `values` ask, in our units. As its device-share proposal
    says: the values are the pod's total, divided evenly over `gpu.shared` cards (absent: a
    memory ratio that is a multiple of 100 over that many, else 1); memory is required
    beside compute; memory and a ratio are not given together."""
    numbers: dict[str, int] = {}
    refusals: list[PeerRefusal] = []
    for name in (CORE, RATIO, BOTH, SHARED):
        if name in values:
            got = whole_number(name, values[name], container, least=1 if name == SHARED else 0)
            if isinstance(got, PeerRefusal):
                refusals.append(got)
            else:
                numbers[name] = got
    if refusals:
        return refusals
    core = numbers.get(CORE, numbers.get(BOTH, 0))
    ratio = numbers.get(RATIO, numbers.get(BOTH, 0))
    mib = 0
    if MEMORY in values:
        got_mib = _memory_mib(values[MEMORY], container)
        if isinstance(got_mib, PeerRefusal):
            return [got_mib]
        mib = got_mib
    if mib and ratio:
        return [PeerRefusal(f"{MEMORY}, {RATIO}", "", "give memory as bytes or as a ratio, "
                            "not both", container)]
    if not mib and not ratio:
        return [PeerRefusal(CORE if core else SHARED, str(values.get(CORE, values.get(SHARED))),
                            f"a share names its memory ({MEMORY} or {RATIO})", container)]
    shared = numbers.get(SHARED, ratio // PERCENT_PER_CARD
                         if ratio and ratio % PERCENT_PER_CARD == 0 else 1)
    for name, total in ((CORE, core), (RATIO, ratio)):
        if total % shared or total // shared > PERCENT_PER_CARD:
            return [PeerRefusal(name, str(total), f"is the total over {shared} cards "
                                f"({SHARED}): it must divide evenly, at most 100 each",
                                container)]
    core, ratio, mib = core // shared, ratio // shared, -(-mib // shared)
    if exclusive(core, ratio):
        return Ask(shared, whole=True)
    too_much = over_largest(MEMORY, values.get(MEMORY), mib, facts, container)
    if too_much is not None:
        return [too_much]
    if ratio:
        sized = memory_of_smallest(RATIO, ratio, ratio, facts, MEMORY, container)
        if isinstance(sized, PeerRefusal):
            return [sized]
        mib = sized
    return Ask(shared, core, mib)


def koordinator_rewrite(name: str, container: Mapping[str, Any],
                        facts: PeerFacts) -> Rewrite | list[PeerRefusal] | None:
    values = merged_resources(container)
    written = tuple(n for n in PEER_RESOURCE_NAMES if n in values)
    if not written:
        return None
    return peer_rewrite(name, written, koordinator_ask(values, facts, name))
