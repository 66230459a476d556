"""What a ResourceClaim of our DeviceClasses asks, in the quota's canonical units. Pure, no I/O.

The webhook reads a pod's ResourceClaims and ResourceClaimTemplates at CREATE (their spec: a
claim is not allocated yet) and puts this demand on the pod as the accounting resources
`quota.elasticgpu.io/gpu-core` / `gpu-memory` (`core.quota`), so that one ResourceQuota counts a
card the same whether it is asked through a device plugin's name or through a claim. The
reading follows `core.quota.canonical_resources`:

- the card class (`gpu.elasticgpu.io`): per device, its `capacity.requests.compute` percent
  (none: the whole card, 100; more than 100 counts 100, the most a device gives) and its
  `capacity.requests.memory` in MiB, rounded up (none: a whole card states no memory);
- the MIG class (`mig.gpu.elasticgpu.io`): per device, 100 x the card fraction of the profile its
  selectors accept (`profile == "3g.40gb"`, read by `core.dra.migselect`), rounded up, and the
  profile's memory; of several accepted (`||`, a memory bound) the largest, measure by measure;
  selectors naming no profile, or not read, count a whole card (the most an instance can be);
- `count` devices (`allocationMode: ExactCount`, the default 1); `All` counts the largest
  node's cards (`all_cards`), the most it can get;
- a `firstAvailable` request counts the largest of its subrequests, measure by measure;
- requests of other classes count nothing (not ours).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from elastic_gpu.core.dra import migselect
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.devices import COMPUTE, MEMORY
from elastic_gpu.core.mig.profiles import card_fraction
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import PERCENT_PER_CARD

OUR_CLASSES = frozenset({CARD_CLASS, MIG_CLASS})
MIB = 1024 * 1024


@dataclass(frozen=True)
class Demand:
    """Compute in percent of one card, memory in MiB (both summed over devices)."""

    core: int = 0
    memory: int = 0

    def __add__(self, other: Demand) -> Demand:
        return Demand(self.core + other.core, self.memory + other.memory)

    def __bool__(self) -> bool:
        return bool(self.core or self.memory)


def _quantity(value: Any) -> Fraction | None:
    try:
        return parse_quantity(value)
    except (QuantityError, TypeError, ValueError):
        return None


def _device(selector: Mapping[str, Any]) -> tuple[str | None, Demand]:
    """One device of an `exactly` (or subrequest) selector: its class and its demand."""
    cls = selector.get("deviceClassName")
    if cls == CARD_CLASS:
        requests = (selector.get("capacity") or {}).get("requests") or {}
        compute = _quantity(requests.get(COMPUTE)) if COMPUTE in requests else None
        memory = _quantity(requests.get(MEMORY)) if MEMORY in requests else None
        core = PERCENT_PER_CARD if compute is None else \
            min(PERCENT_PER_CARD, max(0, math.ceil(compute)))
        mib = 0 if memory is None else max(0, math.ceil(memory / MIB))
        return cls, Demand(core, mib)
    if cls == MIG_CLASS:
        try:
            profiles = migselect.exactly_profiles(selector)
        except migselect.SelectorError:
            profiles = ()
        if not profiles or profiles == migselect.ALL_PROFILES:
            return cls, Demand(PERCENT_PER_CARD, 0)
        return cls, Demand(max(math.ceil(PERCENT_PER_CARD * card_fraction(p)) for p in profiles),
                           max(p.memory_gb * 1024 for p in profiles))
    return None, Demand()


def _count(selector: Mapping[str, Any], all_cards: int) -> int:
    if selector.get("allocationMode") == "All":
        return max(1, all_cards)
    count = selector.get("count", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1


def _selector_demand(selector: Mapping[str, Any], all_cards: int) -> Demand:
    cls, one = _device(selector)
    if cls is None:
        return Demand()
    n = _count(selector, all_cards)
    return Demand(one.core * n, one.memory * n)


def _requests(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    return [r for r in requests or [] if isinstance(r, Mapping)]


def _selectors(request: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    exactly = request.get("exactly")
    if isinstance(exactly, Mapping):
        return [exactly]
    return [s for s in request.get("firstAvailable") or [] if isinstance(s, Mapping)]


def asks_ours(spec: Mapping[str, Any]) -> bool:
    """Whether a claim spec asks a device of one of our DeviceClasses."""
    return any(s.get("deviceClassName") in OUR_CLASSES
               for r in _requests(spec) for s in _selectors(r))


def claim_demand(spec: Mapping[str, Any], all_cards: int = 1) -> Demand:
    """What a claim spec (`ResourceClaim.spec`, a template's `spec.spec`) asks of our classes,
    in the quota's units; `all_cards`: what `allocationMode: All` may get (the largest node's
    cards)."""
    total = Demand()
    for request in _requests(spec):
        if isinstance(request.get("exactly"), Mapping):
            total += _selector_demand(request["exactly"], all_cards)
            continue
        options = [_selector_demand(s, all_cards) for s in _selectors(request)]
        if options:
            total += Demand(max(o.core for o in options), max(o.memory for o in options))
    return total
