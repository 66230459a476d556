"""A node's cards as DRA ResourceSlices for the driver `gpu.elasticgpu.io`. Pure, no I/O.

One pool per node (named after it). What a card becomes:

- **A card without MIG** is one device `gpu-<index>` that several claims may share
  (`allowMultipleAllocations`, consumable capacity, KEP-5075): capacity `compute` in percent of
  the card (step 1, the resource table's `gpu-core` granularity) and `memory` (step 1 MiB, as
  `gpu-memory`). A claim that asks no capacity consumes each capacity's default, the whole
  card: a whole card and a share are one device, asked differently, and kube-scheduler's
  allocator never gives a card more than its capacity across claims.
- **A card with MIG instances** publishes those instances as devices
  `gpu-<index>-mig-<start>-<profile>` that consume its counter set `gpu-<index>` (compute slices
  and memory), partitionable devices (KEP-4815). The layout is the card's as the backend reports
  it: Elastic GPU never changes a real card's MIG layout from the DRA path.
- **Health:** an unhealthy card or instance stays in the slice with the NoSchedule taint
  `gpu.elasticgpu.io/unhealthy` (device taints, beta and on by default in 1.36): claims already
  allocated keep their device, new ones are not given it, and `kubectl get resourceslices -o
  yaml` says why. A card fenced while its MIG layout changes (`Health.FENCED`) has its
  devices tainted `gpu.elasticgpu.io/fenced` the same way.
- **A card in MIG mode with no instance** (its driver's mode on, or a change either way
  pending a GPU reset: `Card.mig_mode`; a card rebooted in MIG mode, a merge-back waiting for
  the operator's reset) is still published as its card device, so the controller's planner
  sees it (as carved: it merges it back or carves it), but with the NoSchedule taint
  `gpu.elasticgpu.io/mig-mode` whose value is the mode (`on`, `on-pending-off`,
  `off-pending-on`): CUDA cannot use a card in MIG mode whole, so no claim is given it. Read
  back (`mig_mode_of_taints`) as the card's `mig_mode`, as the device-plugin path reads a
  GPUDevice's `spec.migMode`; the taint is not a health matter (`health_of_taints` skips it).

Counters live in a slice of their own (the API allows `sharedCounters` or `devices` in a slice,
not both); the pool then has two slices, and both carry the pool's generation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.mig.profiles import card_fraction, card_slices
from elastic_gpu.core.model import Card, Health, MigInstance, MigMode
from elastic_gpu.core.resources import MILLI_PER_PERCENT, PERCENT_PER_CARD

DRIVER = "gpu.elasticgpu.io"
API_VERSION = "resource.k8s.io/v1"
#: Capacity names (in the driver's domain: CEL reads `device.capacity["gpu.elasticgpu.io"].compute`).
COMPUTE = "compute"
MEMORY = "memory"
#: Counter names of a MIG card's counter set.
#: (counter names are DNS labels: kube-apiserver refuses "computeSlices")
COUNTER_SLICES = "compute-slices"
COUNTER_MEMORY = "memory"
UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
#: A card whose MIG layout is changing (dynamic MIG's fence, `Health.FENCED`): its devices
#: stay in the slice with this NoSchedule taint, so claims already allocated keep them and no
#: new claim is given one (docs/mig-apply.md, "DRA nodes").
FENCE_TAINT = f"{DRIVER}/fenced"
#: A card device in MIG mode with no instance, or with a mode change pending a GPU reset
#: (`Card.mig_mode`): NoSchedule, its value the mode (`MIG_MODE_VALUES`).
MIG_MODE_TAINT = f"{DRIVER}/mig-mode"
#: the mig-mode taint's value of each (current, pending) mode but (off, off), which has none
MIG_MODE_VALUES: dict[tuple[bool, bool], str] = {
    (True, True): "on", (True, False): "on-pending-off", (False, True): "off-pending-on"}
#: Attribute `type` of a device: what it is.
TYPE_GPU = "gpu"
TYPE_MIG = "mig"


@dataclass(frozen=True)
class DeviceRef:
    """What a published device name stands for on its node."""

    card: Card
    mig: MigInstance | None = None


def card_device(index: int) -> str:
    return f"gpu-{index}"


def mig_device(index: int, instance: MigInstance) -> str:
    slug = instance.profile.name.replace(".", "-").replace("+", "-")
    return f"gpu-{index}-mig-{instance.start}-{slug}"


def device_table(cards: Sequence[Card]) -> dict[str, DeviceRef]:
    """Device name -> card (and MIG instance): the names `node_slices` publishes."""
    table: dict[str, DeviceRef] = {}
    for card in cards:
        if card.mig:
            for inst in card.mig:
                table[mig_device(card.index, inst)] = DeviceRef(card, inst)
        else:
            table[card_device(card.index)] = DeviceRef(card)
    return table


def _quantity_mib(mib: int) -> str:
    return f"{mib}Mi"


def _common_attributes(card: Card) -> dict[str, dict[str, Any]]:
    attrs: dict[str, dict[str, Any]] = {
        "uuid": {"string": card.uuid},
        "index": {"int": card.index},
        "model": {"string": card.model[:64]},
    }
    if card.numa_node is not None:
        attrs["numaNode"] = {"int": card.numa_node}
    if card.board is not None:
        attrs["board"] = {"string": card.board[:64]}
    return attrs


def _taints(health: Health) -> list[dict[str, Any]]:
    if health is Health.HEALTHY:
        return []
    key = FENCE_TAINT if health is Health.FENCED else UNHEALTHY_TAINT
    return [{"key": key, "value": health.value, "effect": "NoSchedule"}]


def mig_mode_taint(card: Card) -> dict[str, Any] | None:
    """The mig-mode taint of a card device: a card with no instance whose MIG mode is on or
    pending (None otherwise: a card with instances publishes them, not a card device)."""
    mode = card.mig_mode
    if card.mig or mode is None or not (mode.current or mode.pending):
        return None
    return {"key": MIG_MODE_TAINT, "value": MIG_MODE_VALUES[mode.current, mode.pending],
            "effect": "NoSchedule"}


def mig_mode_of_taints(taints: Any) -> MigMode | None:
    """A card device's MIG mode read back from its mig-mode taint (`mig_mode_taint`'s
    inverse); None without one (the mode is then unknown or off: the card serves whole)."""
    for taint in taints if isinstance(taints, list) else ():
        if isinstance(taint, Mapping) and taint.get("key") == MIG_MODE_TAINT:
            for mode, value in MIG_MODE_VALUES.items():
                if taint.get("value") == value:
                    return MigMode(*mode)
            return MigMode(True, True)  # a value we do not know: in MIG mode, never whole
    return None


def health_of_taints(taints: Any) -> Health:
    """A published device's health read back from its taints (`_taints`'s inverse): the
    fence taint alone is `FENCED`, any other taint `UNHEALTHY`; the mig-mode taint is the
    card's mode, not its health, and is skipped."""
    keys = {t.get("key") for t in taints if isinstance(t, Mapping)} \
        if isinstance(taints, list) else set()
    keys.discard(MIG_MODE_TAINT)
    if not keys:
        return Health.HEALTHY
    return Health.FENCED if keys == {FENCE_TAINT} else Health.UNHEALTHY


def card_percent(card: Card) -> int:
    """The card's compute in percent (a chip of a split board may have less than a card)."""
    return max(1, card.compute_milli // MILLI_PER_PERCENT)


def _card_device(card: Card) -> dict[str, Any]:
    percent = card_percent(card)
    device: dict[str, Any] = {
        "name": card_device(card.index),
        "attributes": {"type": {"string": TYPE_GPU}, **_common_attributes(card)},
        "allowMultipleAllocations": True,
        "capacity": {
            COMPUTE: {"value": str(percent), "requestPolicy": {
                "default": str(percent),
                "validRange": {"min": "1", "max": str(percent), "step": "1"}}},
            MEMORY: {"value": _quantity_mib(card.memory_mib), "requestPolicy": {
                "default": _quantity_mib(card.memory_mib),
                "validRange": {"min": "1Mi", "max": _quantity_mib(card.memory_mib),
                               "step": "1Mi"}}},
        },
    }
    taints = _taints(card.health)
    mode_taint = mig_mode_taint(card)
    if mode_taint is not None:
        taints.append(mode_taint)
    if taints:
        device["taints"] = taints
    return device


def _mig_device(card: Card, inst: MigInstance) -> dict[str, Any]:
    memory = inst.profile.memory_gb * 1024
    device: dict[str, Any] = {
        "name": mig_device(card.index, inst),
        "attributes": {"type": {"string": TYPE_MIG}, **_common_attributes(card),
                       "uuid": {"string": inst.uuid},
                       "parentUUID": {"string": card.uuid},
                       "profile": {"string": inst.profile.name},
                       "start": {"int": inst.start}},
        "capacity": {MEMORY: {"value": _quantity_mib(memory)},
                     COMPUTE: {"value": str(math.floor(
                         PERCENT_PER_CARD * card_fraction(inst.profile, card.model)))}},
        "consumesCounters": [{"counterSet": card_device(card.index), "counters": {
            COUNTER_SLICES: {"value": str(inst.profile.slices)},
            COUNTER_MEMORY: {"value": _quantity_mib(memory)}}}],
    }
    worst = Health.UNHEALTHY if Health.UNHEALTHY in (card.health, inst.health) else (
        Health.FENCED if card.health is Health.FENCED else Health.HEALTHY)
    taints = _taints(worst)
    if taints:
        device["taints"] = taints
    return device


def _counter_set(card: Card) -> dict[str, Any]:
    # what the instances can consume at most: the card's slices and memory; the instances the
    # backend reports never sum past them, so these counters never refuse a published device
    memory = max(card.memory_mib, sum(i.profile.memory_gb * 1024 for i in card.mig))
    return {"name": card_device(card.index), "counters": {
        COUNTER_SLICES: {"value": str(card_slices(
            card.model, spanned=sum(i.profile.slices for i in card.mig)))},
        COUNTER_MEMORY: {"value": _quantity_mib(memory)}}}


def slice_name(node: str, part: str = "") -> str:
    return f"{node}-{DRIVER}" + (f"-{part}" if part else "")


def node_slices(node: str, cards: Sequence[Card], generation: int,
                owner: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The node's ResourceSlices (devices, then counters when a card has MIG), in one pool
    `node` at `generation`; `owner` ({"name", "uid"} of the Node) makes them the Node's, so
    they go with it."""
    devices = [_mig_device(card, inst) if inst is not None else _card_device(card)
               for card in sorted(cards, key=lambda c: c.index)
               for inst in (card.mig or (None,))]
    counters = [_counter_set(card) for card in sorted(cards, key=lambda c: c.index) if card.mig]
    parts: list[tuple[str, dict[str, Any]]] = [("", {"devices": devices})]
    if counters:
        parts.append(("counters", {"sharedCounters": counters}))
    out = []
    for part, body in parts:
        meta: dict[str, Any] = {"name": slice_name(node, part),
                                "labels": {"app.kubernetes.io/managed-by": "elastic-gpu"}}
        if owner is not None:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node",
                                        "name": owner["name"], "uid": owner["uid"],
                                        "controller": True}]
        out.append({"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta,
                    "spec": {"driver": DRIVER, "nodeName": node,
                             "pool": {"name": node, "generation": generation,
                                      "resourceSliceCount": len(parts)},
                             **body}})
    return out
