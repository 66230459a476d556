"""DRA nodes as the views see them (`egpu top`): their cards read back from this driver's
ResourceSlices, MIG instances included, and what each allocated ResourceClaim holds of them.
Pure, no I/O.

DRA nodes get no GPUDevice objects: their inventory is the ResourceSlices the agent publishes
(`core.dra.devices.node_slices`), which kube-scheduler (and our allocator) allocate from. A
second object per card would be one more thing to keep equal to the slices, and a GPUDevice
on a DRA node would be counted as free by the extender's device-plugin path (docs/dra.md,
"A node is in one mode"). So the views read the slices:

- a card device `gpu-<index>` is a card (compute from its `compute` capacity in percent,
  memory from its `memory` capacity, unhealthy while it carries a taint, fenced while it
  carries only the fence taint: `core.dra.devices.health_of_taints`; in MIG mode with no
  instance, or with a mode change pending a reset, as its mig-mode taint says: `Card.mig_mode`,
  which the dynamic-MIG planner counts as carved, as it counts a GPUDevice's `spec.migMode`);
- a MIG device is an instance of the card its `index` / `parentUUID` attributes name; a
  MIG-carved card publishes no card device, so it is built from its instances, with the memory
  of its counter set (`sharedCounters`, same name as the card device) when one is published;
- only each pool's newest generation counts, as in kube-scheduler's allocator.

A claim's allocation results of this driver on a node are its hold there, read with the
kubelet plugin's own reading (`core.dra.allocation.allocated_devices`); its users are the pods
it is reserved for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.dra.allocation import AllocationError, allocated_devices
from elastic_gpu.core.dra.devices import (
    COMPUTE,
    COUNTER_MEMORY,
    DRIVER,
    MEMORY,
    TYPE_GPU,
    TYPE_MIG,
    device_table,
    health_of_taints,
    mig_mode_of_taints,
)
from elastic_gpu.core.model import Card, Health, MigInstance
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import MILLI_PER_CARD, MILLI_PER_PERCENT, MigProfile, ResourceError

MIB = 1024 * 1024


@dataclass(frozen=True)
class ClaimHold:
    """What one ResourceClaim holds on one DRA node."""

    namespace: str
    name: str
    node: str
    shares: tuple[CardShare, ...]
    #: the pods it is reserved for (`<namespace>/<pod>`)
    users: tuple[str, ...] = ()


def _attr(device: Mapping[str, Any], name: str) -> Any:
    value = (device.get("attributes") or {}).get(name)
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _quantity(entry: Any) -> Fraction | None:
    value = entry.get("value") if isinstance(entry, Mapping) else None
    if value is None:
        return None
    try:
        return parse_quantity(str(value))
    except QuantityError:
        return None


def _newest(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    ours = [s for s in slices if (s.get("spec") or {}).get("driver") == DRIVER
            and isinstance((s.get("spec") or {}).get("nodeName"), str)]
    newest: dict[str, int] = {}
    for s in ours:
        pool = (s["spec"].get("pool") or {})
        gen = pool.get("generation")
        if isinstance(gen, int):
            key = str(pool.get("name"))
            newest[key] = max(newest.get(key, gen), gen)
    return [s for s in ours if (s["spec"].get("pool") or {}).get("generation")
            == newest.get(str((s["spec"].get("pool") or {}).get("name")))]


def node_cards(slices: Iterable[Mapping[str, Any]]) -> dict[str, list[Card]]:
    """DRA node -> its cards (by index), from this driver's ResourceSlices."""
    cards: dict[str, dict[int, Card]] = {}
    instances: dict[tuple[str, int], list[tuple[MigInstance, str, str]]] = {}
    counters: dict[tuple[str, str], int] = {}
    for s in _newest(slices):
        node = str(s["spec"]["nodeName"])
        for counter_set in s["spec"].get("sharedCounters") or []:
            if isinstance(counter_set, Mapping):
                memory = _quantity((counter_set.get("counters") or {}).get(COUNTER_MEMORY))
                if memory is not None:
                    counters[node, str(counter_set.get("name"))] = int(memory // MIB)
        for device in s["spec"].get("devices") or []:
            if not isinstance(device, Mapping):
                continue
            index, kind = _attr(device, "index"), _attr(device, "type")
            if not isinstance(index, int) or index < 0:
                continue
            health = health_of_taints(device.get("taints"))
            if kind == TYPE_GPU:
                capacity = device.get("capacity") or {}
                percent, memory = _quantity(capacity.get(COMPUTE)), _quantity(capacity.get(MEMORY))
                if percent is None or memory is None:
                    continue
                numa, board = _attr(device, "numaNode"), _attr(device, "board")
                cards.setdefault(node, {})[index] = Card(
                    index=index, uuid=str(_attr(device, "uuid")),
                    model=str(_attr(device, "model") or "unknown"),
                    memory_mib=int(memory // MIB),
                    compute_milli=min(MILLI_PER_CARD, max(1, int(percent) * MILLI_PER_PERCENT)),
                    health=health, numa_node=numa if isinstance(numa, int) else None,
                    board=board if isinstance(board, str) else None,
                    mig_mode=mig_mode_of_taints(device.get("taints")))
            elif kind == TYPE_MIG:
                try:
                    profile = MigProfile.parse(str(_attr(device, "profile")))
                except ResourceError:
                    continue
                start = _attr(device, "start")
                inst = MigInstance(profile, str(_attr(device, "uuid")),
                                   start if isinstance(start, int) else 0, health)
                instances.setdefault((node, index), []).append(
                    (inst, str(_attr(device, "parentUUID")),
                     str(_attr(device, "model") or "unknown")))
    for (node, index), found in instances.items():
        mine = cards.setdefault(node, {})
        if index in mine:
            continue
        parent, model = found[0][1], found[0][2]
        card_mib = counters.get((node, f"gpu-{index}"),
                                sum(i.profile.memory_gb * 1024 for i, _, _ in found))
        fenced = all(i.health is Health.FENCED for i, _, _ in found)
        mine[index] = Card(index=index, uuid=parent, model=model, memory_mib=card_mib,
                           health=Health.FENCED if fenced else Health.HEALTHY,
                           mig=tuple(sorted((i for i, _, _ in found),
                                            key=lambda i: (i.start, i.uuid))))
    return {node: [by_index[i] for i in sorted(by_index)] for node, by_index in cards.items()}


def claim_holds(claims: Iterable[Mapping[str, Any]], cards: Mapping[str, list[Card]]
                ) -> tuple[list[ClaimHold], list[str]]:
    """What each allocated claim holds on each DRA node of `cards`, and why any could not be
    read (a device the node does not publish now: a stale allocation)."""
    holds: list[ClaimHold] = []
    problems: list[str] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        allocation = (claim.get("status") or {}).get("allocation") or {}
        pools = {str(r.get("pool")) for r in (allocation.get("devices") or {}).get("results")
                 or [] if isinstance(r, Mapping) and r.get("driver") == DRIVER}
        users = tuple(sorted(f"{namespace}/{r.get('name')}"
                             for r in (claim.get("status") or {}).get("reservedFor") or []
                             if isinstance(r, Mapping) and r.get("resource", "pods") == "pods"))
        for node in sorted(pools & set(cards)):
            try:
                held = allocated_devices(claim, node, device_table(cards[node]))
            except AllocationError as err:
                problems.append(f"ResourceClaim {namespace}/{name}: {err}")
                continue
            if held:
                holds.append(ClaimHold(namespace, name, node,
                                       tuple(a.share for a in held), users))
    return holds, problems
