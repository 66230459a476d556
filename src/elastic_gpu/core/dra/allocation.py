"""A ResourceClaim's allocation, for this driver on one node, as card shares. Pure, no I/O.

The kubelet plugin prepares each allocated device with what the device-plugin path's Allocate
gives a container for the same share (`agent.grant.build_grant`); the independent ledger check
counts DRA-held cards with the same `CardShare`s it counts pods' assignments with. So both
paths agree on what "a share of a card" is: a card device's `consumedCapacity` (compute
percent, memory) or, without it, the whole card; a MIG device is its instance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.devices import COMPUTE, DRIVER, MEMORY, DeviceRef, card_percent
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import MILLI_PER_PERCENT

MIB = 1024 * 1024


class AllocationError(ValueError):
    """An allocation result this node cannot honour: refuse to prepare it, naming why."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocated device of a claim: the request it serves and its share of the card."""

    request: str
    device: str
    share: CardShare
    #: The allocation's share id (KEP-5075) when the device is shared, else None.
    share_id: str | None = None


def _consumed(result: Mapping[str, Any], name: str) -> Fraction | None:
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, Mapping) or name not in consumed:
        return None
    try:
        return parse_quantity(consumed[name])
    except QuantityError as err:
        raise AllocationError(f"device {result.get('device')!r}: consumedCapacity {name}: "
                              f"{err}") from None


def _share(result: Mapping[str, Any], ref: DeviceRef) -> CardShare:
    card = ref.card
    if ref.mig is not None:
        inst = ref.mig
        return CardShare(card.index, card.uuid, 0, inst.profile.memory_gb * 1024,
                         inst.profile.name, inst.uuid)
    percent = _consumed(result, COMPUTE)
    memory = _consumed(result, MEMORY)
    full = card_percent(card)
    if percent is None and memory is None:
        return CardShare(card.index, card.uuid, card.compute_milli, card.memory_mib)
    pct = full if percent is None else percent
    mem = Fraction(card.memory_mib * MIB) if memory is None else memory
    if pct.denominator != 1 or not 0 < pct <= full:
        raise AllocationError(f"device {ref_name(result)}: consumes compute {pct}, not a whole "
                              f"percent in 1..{full}")
    if mem % MIB or not 0 < mem <= card.memory_mib * MIB:
        raise AllocationError(f"device {ref_name(result)}: consumes memory {mem} bytes, not "
                              f"whole MiB in 1..{card.memory_mib} MiB")
    if pct == full and mem == card.memory_mib * MIB:
        return CardShare(card.index, card.uuid, card.compute_milli, card.memory_mib)
    return CardShare(card.index, card.uuid, int(pct) * MILLI_PER_PERCENT, int(mem // MIB))


def ref_name(result: Mapping[str, Any]) -> str:
    return repr(result.get("device"))


def node_results(claim: Mapping[str, Any], node: str) -> list[Mapping[str, Any]]:
    """The claim's allocation results of this driver in this node's pool."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results")) or []
    return [r for r in results if isinstance(r, Mapping)
            and r.get("driver") == DRIVER and r.get("pool") == node]


def allocated_devices(claim: Mapping[str, Any], node: str,
                      table: Mapping[str, DeviceRef]) -> list[AllocatedDevice]:
    """Every device of this driver the claim was allocated on `node`, as card shares.
    Raises AllocationError for a device this node does not publish (a stale allocation: the
    card left, or the MIG layout changed) or a capacity it cannot give."""
    out = []
    for result in node_results(claim, node):
        name = result.get("device")
        ref = table.get(name) if isinstance(name, str) else None
        if ref is None:
            raise AllocationError(f"device {name!r} is not one this node publishes "
                                  f"(now: {', '.join(sorted(table)) or 'none'})")
        share_id = result.get("shareID")
        out.append(AllocatedDevice(str(result.get("request", "")), str(name), _share(result, ref),
                                   share_id if isinstance(share_id, str) else None))
    return out
