"""What a Node object's status says, read one way by every component. Pure.

Two facts, each with a reason for where it is read:
- **allocatable** CPU and memory (`allocatable`): what pods may use; a Node that has no
  `status.allocatable` at all (a hand-made object, an old kwok) is read from `capacity`.
- **GPU capacity** (`gpu_capacity`): the GPU resources the node serves, from `capacity`, not
  allocatable: allocatable drops to 0 while a card is unhealthy, but what the node serves does
  not change then (health is checked per card, and a node turned away for a sick card would
  never be woken when it heals).
Before, the extender, the inventory reader and admission each read these their own way
(allocatable-then-capacity, allocatable only, capacity), which drifted.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import is_gpu_resource


def _status(node: Mapping[str, Any]) -> Mapping[str, Any]:
    status = node.get("status") if isinstance(node, Mapping) else None
    return status if isinstance(status, Mapping) else {}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def allocatable(node: Mapping[str, Any], key: str, scale: int = 1) -> int:
    """`status.allocatable[key]` (or capacity, for a Node without allocatable) times `scale`,
    rounded down; 0 when absent or unreadable."""
    status = _status(node)
    amounts = _mapping(status.get("allocatable")) or _mapping(status.get("capacity"))
    raw = amounts.get(key)
    if raw is None:
        return 0
    try:
        return int(parse_quantity(raw) * scale)
    except QuantityError:
        return 0


def gpu_capacity(node: Mapping[str, Any]) -> dict[str, Fraction | None]:
    """Every GPU resource name in `status.capacity` (or allocatable, for a Node without
    capacity) with its quantity; None where the value cannot be read (callers decide whether
    that counts as 0 or as absent)."""
    status = _status(node)
    amounts = _mapping(status.get("capacity")) or _mapping(status.get("allocatable"))
    out: dict[str, Fraction | None] = {}
    for key, raw in amounts.items():
        if not isinstance(key, str) or not is_gpu_resource(key):
            continue
        try:
            out[key] = (parse_quantity(raw) if isinstance(raw, (str, int, float))
                        and not isinstance(raw, bool) else None)
        except QuantityError:
            out[key] = None
    return out
