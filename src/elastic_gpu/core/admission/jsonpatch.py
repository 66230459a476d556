"""JSON Patch (RFC 6902): the operations the mutators make, and applying them as
kube-apiserver does (admission applies each mutator's patch before the next one reads the pod).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

#: One JSON Patch operation, e.g. {"op": "add", "path": "/metadata/annotations/a", "value": "1"}.
PatchOp = dict[str, Any]


def pointer(*parts: str | int) -> str:
    """A JSON Pointer (RFC 6901) from its unescaped parts."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def set_annotation(pod: Mapping[str, Any], key: str, value: str) -> PatchOp:
    """The operation that sets one annotation, whether or not the pod has any."""
    if not isinstance((pod.get("metadata") or {}).get("annotations"), Mapping):
        return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}
    return {"op": "add", "path": pointer("metadata", "annotations", key), "value": value}


class PatchError(ValueError):
    """A JSON Patch operation that does not apply to the document."""


def _split(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply_patch(document: Any, ops: Iterable[PatchOp]) -> Any:
    """A copy of `document` with the `add`, `replace` and `remove` operations applied (the
    kinds the mutators make), as kube-apiserver applies them."""
    result = copy.deepcopy(document)
    for op in ops:
        parts = _split(str(op["path"]))
        parent: Any = result
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[index]
            else:
                raise PatchError(f"unsupported op {kind!r}")
        elif isinstance(parent, dict):
            if kind in ("add", "replace"):
                if kind == "replace" and last not in parent:
                    raise PatchError(f"replace of missing {op['path']}")
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            else:
                raise PatchError(f"unsupported op {kind!r}")
        else:
            raise PatchError(f"{op['path']}: parent is not a container")
    return result
