"""ResourceSlices in the API: publishing one node's pool of the driver `gpu.elasticgpu.io`.

The shapes are `core.dra.devices.node_slices` (pure); this module only compares them with what
the API holds and writes the difference, through the project's one client stack. A pool is
rewritten whole at a new generation when anything in it changed (kube-scheduler uses only the
slices of a pool's newest generation, so a half-written pool is never allocated from), and
left alone when nothing did: an agent restart or a periodic resync writes nothing (quantities
are compared as numbers: the API server writes them back in its canonical form).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from elastic_gpu.core.dra.devices import DRIVER, node_slices
from elastic_gpu.core.model import Card
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import RESOURCE_SLICES
from elastic_gpu.kube.sync import SyncKubeClient

#: Keys whose string values are quantities (capacity values, request policies, counters).
_QUANTITY_KEYS = frozenset({"value", "default", "min", "max", "step"})


def _canonical(obj: Any) -> Any:
    """`obj` with every quantity as its number: the API server writes `40960Mi` back as
    `40Gi`, and a pool must not be rewritten at a new generation for that."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key in _QUANTITY_KEYS and isinstance(value, str):
                try:
                    out[key] = parse_quantity(value)
                    continue
                except QuantityError:
                    pass
            out[key] = _canonical(value)
        return out
    if isinstance(obj, list):
        return [_canonical(item) for item in obj]
    return obj


def _comparable(spec: dict[str, Any]) -> dict[str, Any]:
    pool = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    comparable: dict[str, Any] = _canonical({**spec, "pool": pool})
    return comparable


def existing_slices(client: SyncKubeClient, node: str) -> list[dict[str, Any]]:
    """This driver's slices of `node`'s pool, as the API holds them."""
    items, _ = client.list(RESOURCE_SLICES.path(), {
        "fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"})
    return [s for s in items
            if (s.get("spec") or {}).get("pool", {}).get("name") == node]


def publish_node_slices(client: SyncKubeClient, node: str, cards: Sequence[Card],
                        node_uid: str | None = None) -> bool:
    """Make the API's slices of `node` say `cards`; True when anything was written."""
    have = existing_slices(client, node)
    owner = {"name": node, "uid": node_uid} if node_uid else None
    generation = max([int((s["spec"].get("pool") or {}).get("generation", 0)) for s in have],
                     default=0)
    want = node_slices(node, cards, generation, owner)
    by_name = {s["metadata"]["name"]: s for s in have}
    same = (len(have) == len(want) and all(
        w["metadata"]["name"] in by_name
        and _comparable(by_name[w["metadata"]["name"]]["spec"]) == _comparable(w["spec"])
        for w in want))
    if same:
        return False
    want = node_slices(node, cards, generation + 1, owner)
    wanted = {w["metadata"]["name"] for w in want}
    for slice_ in want:
        name = slice_["metadata"]["name"]
        if name in by_name:
            body = {**slice_, "metadata": {**slice_["metadata"], "resourceVersion":
                                           by_name[name]["metadata"]["resourceVersion"]}}
            client.update(RESOURCE_SLICES.path(name=name), body)
        else:
            client.create(RESOURCE_SLICES.path(), slice_)
    for name in set(by_name) - wanted:
        with contextlib.suppress(NotFound):
            client.delete(RESOURCE_SLICES.path(name=name))
    return True


def withdraw_node_slices(client: SyncKubeClient, node: str) -> None:
    """Remove the node's slices (the agent leaves DRA mode, or the node goes)."""
    for slice_ in existing_slices(client, node):
        with contextlib.suppress(NotFound):
            client.delete(RESOURCE_SLICES.path(name=slice_["metadata"]["name"]))
