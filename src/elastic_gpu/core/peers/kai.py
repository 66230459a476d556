"""KAI Scheduler's GPU sharing annotations, read as ours.

KAI (docs/gpu-sharing in NVIDIA/KAI-Scheduler) shares a card by memory, on a pod of
`schedulerName: kai-scheduler`:
- `gpu-fraction: "0.5"`: half of each card's memory; here MiB of the cluster's smallest card
  (our shares are MiB), and `1` is the whole card;
- `gpu-memory: "2000"`: MiB of each card;
- `gpu-fraction-num-devices: "N"`: N such shares on N cards;
- `gpu-fraction-container-name`: the container that gets them (the first one by default).
KAI reserves no compute (it does not isolate); neither do we for these shares: the container
is a memory share, and the webhook gives it the 1 % compute device kubelet needs to call the
agent (`memory_only_compute`).
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
    Translation,
    merged_resources,
    whole_number,
)
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import lookup

SCHEDULER = "kai-scheduler"
FRACTION = "gpu-fraction"
MEMORY = "gpu-memory"
DEVICES = "gpu-fraction-num-devices"
CONTAINER = "gpu-fraction-container-name"
PEER_ANNOTATIONS = (FRACTION, MEMORY, DEVICES, CONTAINER)


def _fraction(raw: str) -> Fraction | PeerRefusal:
    try:
        value = parse_quantity(raw)
    except QuantityError:
        value = Fraction(-1)
    if not 0 < value <= 1:
        return PeerRefusal(FRACTION, raw, "is a fraction of a card's memory, above 0 and at "
                           "most 1")
    return value


def kai_translation(pod: Mapping[str, Any], facts: PeerFacts) -> Translation:
    """The rewrite of a KAI pod's GPU container (none for a pod of another scheduler, without
    KAI's annotations, or whose container asks our GPU resources already)."""
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if spec.get("schedulerName") != SCHEDULER or not (FRACTION in annotations
                                                      or MEMORY in annotations):
        return Translation()
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    wanted = annotations.get(CONTAINER)
    target = next((c for c in containers if wanted is None or c.get("name") == wanted), None)
    if target is None:
        return Translation(refusals=(PeerRefusal(CONTAINER, str(wanted),
                                                 "names no container of the pod"),))
    name = str(target.get("name", ""))
    if any(lookup(k) for k in merged_resources(target)):
        return Translation()  # translated already, or the user's own request wins
    cards = whole_number(DEVICES, annotations.get(DEVICES, 1), name, least=1)
    if isinstance(cards, PeerRefusal):
        return Translation(refusals=(cards,))
    if FRACTION in annotations and MEMORY in annotations:
        return Translation(refusals=(PeerRefusal(f"{FRACTION}, {MEMORY}", "",
                                                 "give a fraction or MiB, not both", name),))
    if MEMORY in annotations:
        mib = whole_number(MEMORY, annotations[MEMORY], name, least=1,
                           most=facts.largest_card_memory_mib or None)
        if isinstance(mib, PeerRefusal):
            return Translation(refusals=(mib,))
        ask = Ask(cards, 0, mib)
    else:
        fraction = _fraction(str(annotations[FRACTION]))
        if isinstance(fraction, PeerRefusal):
            return Translation(refusals=(fraction,))
        if fraction == 1:
            ask = Ask(cards, whole=True)
        elif not facts.smallest_card_memory_mib:
            return Translation(refusals=(PeerRefusal(
                FRACTION, str(annotations[FRACTION]), "is sized on the cluster's smallest card, "
                "and no GPU node is known yet; give gpu-memory in MiB", name),))
        else:
            ask = Ask(cards, 0, max(1, int(fraction * facts.smallest_card_memory_mib)))
    return Translation(rewrites=(Rewrite(name, (), ask.resources()),))
