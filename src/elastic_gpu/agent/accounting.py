"""What pods hold of each card, summed from their assignment annotations (pure).

These sums are the GPUDevice allocation columns. Only pods that still hold their cards count:
bound to this node, not finished, not being deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elastic_gpu.agent.matching import TERMINAL_PHASES
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, AssignmentError


def allocation_by_card(pods: Iterable[Mapping[str, Any]], node: str) -> dict[int, tuple[int, int]]:
    """{card index: (milli, memory MiB)} held by pods on `node`; bad annotations are skipped
    (the scheduler and webhook report them; accounting must not stop on one pod)."""
    totals: dict[int, tuple[int, int]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName") != node or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        raw = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        if not raw:
            continue
        try:
            assignment = Assignment.from_json(raw)
        except AssignmentError:
            continue
        if assignment.node != node:
            continue
        for share in assignment.shares():
            milli, memory = totals.get(share.index, (0, 0))
            totals[share.index] = (milli + share.milli, memory + share.memory_mib)
    return totals
