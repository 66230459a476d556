"""An in-memory stand-in for `kube.sync.SyncKubeClient`: enough of the API server's object
store for the agent's publishers (get, list with label and field selectors, create, update,
merge patch of an object or its `status`, delete), no watch. Objects are keyed by their
collection path and name; `resourceVersion` counts writes."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from elastic_gpu.kube.errors import AlreadyExists, NotFound


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: a mapping merges key by key, None removes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _field(obj: Mapping[str, Any], dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _selected(obj: Mapping[str, Any], params: Mapping[str, str] | None) -> bool:
    params = params or {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, params.get("labelSelector", "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    for term in filter(None, params.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        if str(_field(obj, key)) != value:
            return False
    return True


class MemoryApi:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []  # (verb, path), in order
        self._versions = itertools.count(1)

    @staticmethod
    def _key(path: str) -> tuple[str, str, bool]:
        """(collection, name, is status) of an object's path."""
        status = path.endswith("/status")
        if status:
            path = path[: -len("/status")]
        collection, _, name = path.rpartition("/")
        return collection, name, status

    def _store(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[collection, obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    def add(self, collection: str, obj: Mapping[str, Any]) -> None:
        """Seed an object (not counted as a write)."""
        body = copy.deepcopy(dict(obj))
        body["metadata"].setdefault("uid", f"uid-{body['metadata']['name']}")
        self._store(collection, body)

    def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        collection, name, _ = self._key(path)
        try:
            return copy.deepcopy(self.objects[collection, name])
        except KeyError:
            raise NotFound(404, "NotFound", path) from None

    def list(self, path: str, params: Mapping[str, str] | None = None
             ) -> tuple[list[dict[str, Any]], str]:
        items = [copy.deepcopy(obj) for (collection, _), obj in sorted(self.objects.items())
                 if collection == path and _selected(obj, params)]
        return items, "0"

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(dict(obj))
        if (path, body["metadata"]["name"]) in self.objects:
            raise AlreadyExists(409, "AlreadyExists", path)
        self.writes.append(("create", path))
        body["metadata"].setdefault("uid", f"uid-{body['metadata']['name']}")
        body.pop("status", None)  # the status subresource ignores status on create
        return self._store(path, body)

    def update(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        collection, _, _ = self._key(path)
        self.get(path)
        self.writes.append(("update", path))
        return self._store(collection, copy.deepcopy(dict(obj)))

    def patch(self, path: str, patch: Any, content_type: str = "",
              params: Mapping[str, str] | None = None) -> dict[str, Any]:
        collection, _, status = self._key(path)
        current = self.get(path)
        self.writes.append(("patch", path))
        if status:
            patch = {"status": patch.get("status")}
        else:
            patch = {k: v for k, v in patch.items() if k != "status"}
        return self._store(collection, merge_patch(current, patch))

    def delete(self, path: str, **_: Any) -> dict[str, Any]:
        collection, name, _ = self._key(path)
        obj = self.get(path)
        self.writes.append(("delete", path))
        del self.objects[collection, name]
        return obj
