"""What the DRA allocator places on: DRA nodes' cards read back from this driver's
ResourceSlices, and what every allocated ResourceClaim (whoever allocated it) holds of them.
Pure, no I/O.

The slices are the agent's (`core.dra.devices.node_slices`); reading them back gives the cards
the agent published: a card device `gpu-<index>` with capacity `compute` (percent) and `memory`
is one placeable card; a card carved into MIG instances is not placeable by shares, and
`cards_from_slices` leaves it out; `placeable_cards` adds it with its instances (the MIG
class's devices, which the allocator places too: `core.dra.sliceview.node_cards`' reading).
A card device with the mig-mode taint (`core.dra.devices.MIG_MODE_TAINT`) is read with its
`mig_mode`, as the extender reads a GPUDevice's `spec.migMode`: in MIG mode now, the engine
places nothing on it (`Card.mig_enabled`); one whose MIG mode on waits for a GPU reset (whole
now, MIG after the reset) is left out, so kube-scheduler (which sees the taint) and this
allocator agree that no claim is given it.
Only a pool's newest generation counts, as in kube-scheduler's allocator.

A claim's allocation results of this driver are a fact whoever wrote them: the allocator's
engine holds them under the claim's key (`claim_key`), so a claim shared by several pods is
held once, and a claim kube-scheduler allocated (an ungated pod, the extended-resource mapping,
another class selecting our devices) takes its capacity as surely as one of ours.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.dra.allocation import AllocationError, allocated_devices
from elastic_gpu.core.dra.devices import (
    COMPUTE,
    DRIVER,
    MEMORY,
    TYPE_GPU,
    DeviceRef,
    device_table,
    health_of_taints,
    mig_mode_of_taints,
)
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.core.model import Card
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import MILLI_PER_CARD, MILLI_PER_PERCENT

MIB = 1024 * 1024
#: The ledger key prefix of a ResourceClaim's hold (`claim_key`).
CLAIM_KEY_PREFIX = "resourceclaim:"


def claim_key(namespace: str, name: str) -> str:
    """The allocator's ledger key of a ResourceClaim: one per claim, however many pods use it."""
    return f"{CLAIM_KEY_PREFIX}{namespace}/{name}"


def _attr(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name) or {}
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _capacity(device: Mapping[str, Any], name: str) -> Fraction | None:
    entry = (device.get("capacity") or {}).get(name)
    if not isinstance(entry, Mapping) or "value" not in entry:
        return None
    try:
        return parse_quantity(str(entry["value"]))
    except QuantityError:
        return None


def card_from_device(device: Mapping[str, Any]) -> Card | None:
    """A card device of this driver's slice as the core `Card`; None for a MIG instance or a
    device that does not read as one of our cards."""
    if _attr(device, "type") != TYPE_GPU:
        return None
    index, uuid, model = _attr(device, "index"), _attr(device, "uuid"), _attr(device, "model")
    percent, memory = _capacity(device, COMPUTE), _capacity(device, MEMORY)
    if (not isinstance(index, int) or index < 0 or not isinstance(uuid, str)
            or percent is None or memory is None or memory < MIB):
        return None
    mode = mig_mode_of_taints(device.get("taints"))
    if mode is not None and mode.pending and not mode.current:
        return None  # still whole until its reset, then MIG: left out, as a carved card is
    milli = min(MILLI_PER_CARD, max(1, int(percent) * MILLI_PER_PERCENT))
    health = health_of_taints(device.get("taints"))
    numa = _attr(device, "numaNode")
    board = _attr(device, "board")
    return Card(index=index, uuid=uuid, model=str(model or "unknown"),
                memory_mib=int(memory // MIB), compute_milli=milli, health=health,
                numa_node=numa if isinstance(numa, int) else None,
                board=board if isinstance(board, str) else None,
                mig_mode=mode)


def cards_from_slices(slices: Iterable[Mapping[str, Any]]) -> dict[str, list[Card]]:
    """Node -> its placeable cards, from this driver's ResourceSlices (each pool's newest
    generation only; a slice of another driver, or one not bound to a node, is ignored)."""
    newest: dict[str, int] = {}
    kept: list[tuple[str, int, Mapping[str, Any]]] = []
    for obj in slices:
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        pool = spec.get("pool") or {}
        if spec.get("driver") != DRIVER or not isinstance(node, str) or not node:
            continue
        raw = pool.get("generation")
        generation = raw if isinstance(raw, int) else 0
        newest[node] = max(newest.get(node, generation), generation)
        kept.append((node, generation, spec))
    out: dict[str, list[Card]] = {}
    for node, generation, spec in kept:
        if generation != newest[node]:
            continue
        cards = out.setdefault(node, [])
        for device in spec.get("devices") or []:
            card = card_from_device(device) if isinstance(device, Mapping) else None
            if card is not None and all(c.index != card.index for c in cards):
                cards.append(card)
    return out


def placeable_cards(slices: Iterable[Mapping[str, Any]]) -> dict[str, list[Card]]:
    """Node -> what the allocator places on: the card devices as `cards_from_slices` reads
    them, and the MIG-carved cards with their instances (`sliceview.node_cards`), by index."""
    items = list(slices)
    out = cards_from_slices(items)
    for node, cards in node_cards(items).items():
        mine = out.setdefault(node, [])
        known = {c.index for c in mine}
        mine.extend(c for c in cards if c.mig and c.index not in known)
        mine.sort(key=lambda c: c.index)
    return {node: cards for node, cards in out.items() if cards}


def allocated_pools(claim: Mapping[str, Any]) -> set[str]:
    """The nodes (this driver's pools) an allocated claim's devices are on."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results") or []
    return {str(r.get("pool")) for r in results
            if isinstance(r, Mapping) and r.get("driver") == DRIVER}


def claim_hold(claim: Mapping[str, Any], tables: Mapping[str, Mapping[str, DeviceRef]]
               ) -> Assignment | None:
    """What an allocated claim holds of our DRA nodes' cards, as one `Assignment` (container
    `claim`), or None: not allocated, no device of ours, or a node the inventory does not
    know. A device the node no longer publishes is left out (the card left)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    pools = {str(r.get("pool")) for r in (allocation.get("devices") or {}).get("results") or []
             if isinstance(r, Mapping) and r.get("driver") == DRIVER}
    for node in sorted(pools):
        table = tables.get(node)
        if table is None:
            continue
        try:
            devices = allocated_devices(claim, node, table)
        except AllocationError:
            devices = [d for r in _single_results(claim, node) for d in _readable(r, node, table)]
        shares: list[CardShare] = [d.share for d in devices]
        if shares:
            return Assignment(node, {"claim": tuple(shares)})
    return None


def _single_results(claim: Mapping[str, Any], node: str) -> list[Mapping[str, Any]]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results") or []
    return [r for r in results if isinstance(r, Mapping) and r.get("driver") == DRIVER
            and r.get("pool") == node]


def _readable(result: Mapping[str, Any], node: str, table: Mapping[str, DeviceRef]) -> list[Any]:
    one = {"status": {"allocation": {"devices": {"results": [result]}}}}
    try:
        return list(allocated_devices(one, node, table))
    except AllocationError:
        return []


def tables_of(cards: Mapping[str, Iterable[Card]]) -> dict[str, dict[str, DeviceRef]]:
    """Node -> its device table (`core.dra.devices.device_table`)."""
    return {node: device_table(list(node_cards)) for node, node_cards in cards.items()}
