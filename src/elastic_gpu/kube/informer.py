"""A reflector with its store: list, then watch from the list's resourceVersion.

- The watch asks for bookmarks, so a quiet collection's resourceVersion stays fresh and a
  re-watch after the server ends one (every `watch_timeout_s`) rarely meets 410.
- 410 Gone (or any broken list/watch, after a backoff) relists and *replaces* the store: an
  object deleted while nothing was watching is delivered to the handlers as a deletion, one
  that changed as an update, a new one as an add (client-go's Replace).
- `has_synced` turns true after the first list has been delivered; handlers run in the event
  loop, synchronously, and must not block (a controller's handler enqueues a key).
- `missing_ok` (a CRD that may not be installed): a 404 on the list counts as an empty,
  synced collection (objects known are delivered as deletions) and the list is retried every
  `missing_retry_s`, so one uninstalled CRD does not hold back every controller's start.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from elastic_gpu.kube.errors import ApiError, Gone, NotFound

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class ListWatcher(Protocol):
    """What the informer needs from a client (`kube.client.KubeClient` is one)."""

    async def list(self, path: str, params: Mapping[str, str] | None = None
                   ) -> tuple[list[Obj], str]: ...

    def watch(self, path: str, resource_version: str, params: Mapping[str, str] | None = None,
              timeout_s: int = 300) -> AsyncIterator[tuple[str, Obj]]: ...


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object (client-go's MetaNamespaceKey)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass(frozen=True)
class Handler:
    """Callbacks for an informer's changes; each may be None."""

    on_add: Callable[[Obj], None] | None = None
    on_update: Callable[[Obj, Obj], None] | None = None
    on_delete: Callable[[Obj], None] | None = None


class Informer:
    """One collection, listed and watched, kept in `store` (key -> object)."""

    def __init__(self, client: ListWatcher, path: str, *, name: str,
                 params: Mapping[str, str] | None = None, watch_timeout_s: int = 300,
                 backoff_s: tuple[float, float] = (0.2, 30.0), missing_ok: bool = False,
                 missing_retry_s: float = 10.0) -> None:
        self.client = client
        self.missing_ok = missing_ok
        self.missing_retry_s = missing_retry_s
        self.path = path
        self.name = name
        self.params = dict(params or {})
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.store: dict[str, Obj] = {}
        self.handlers: list[Handler] = []
        self.relists = 0
        self.last_resource_version = ""
        self._synced = asyncio.Event()

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def get(self, key: str) -> Obj | None:
        return self.store.get(key)

    def items(self) -> list[Obj]:
        return list(self.store.values())

    # ------------------------------------------------------------------ delivery

    def _emit_add(self, obj: Obj) -> None:
        for h in self.handlers:
            if h.on_add is not None:
                h.on_add(obj)

    def _emit_update(self, old: Obj, new: Obj) -> None:
        for h in self.handlers:
            if h.on_update is not None:
                h.on_update(old, new)

    def _emit_delete(self, obj: Obj) -> None:
        for h in self.handlers:
            if h.on_delete is not None:
                h.on_delete(obj)

    def replace(self, items: list[Obj]) -> None:
        """A (re)list's result replaces the store; the differences go to the handlers."""
        new = {object_key(obj): obj for obj in items}
        old = self.store
        self.store = new
        for key, obj in old.items():
            if key not in new:
                self._emit_delete(obj)
        for key, obj in new.items():
            before = old.get(key)
            if before is None:
                self._emit_add(obj)
            elif resource_version(before) != resource_version(obj):
                self._emit_update(before, obj)
        self._synced.set()

    def apply(self, kind: str, obj: Obj) -> None:
        """One watch event (ADDED, MODIFIED, DELETED; BOOKMARK only moves the version)."""
        version = resource_version(obj)
        if version:
            self.last_resource_version = version
        if kind == "BOOKMARK":
            return
        key = object_key(obj)
        log.debug("%s: %s %s@%s", self.name, kind, key, version)
        before = self.store.get(key)
        if kind == "DELETED":
            self.store.pop(key, None)
            self._emit_delete(obj)
        elif before is None:
            self.store[key] = obj
            self._emit_add(obj)
        else:
            self.store[key] = obj
            self._emit_update(before, obj)

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """List and watch until cancelled."""
        failures = 0
        while True:
            try:
                items, version = await self.client.list(self.path, self.params)
                self.relists += 1
                self.last_resource_version = version
                self.replace(items)
                failures = 0
                while True:  # re-watch from the newest version seen until 410 or a failure
                    async for kind, obj in self.client.watch(
                            self.path, self.last_resource_version, self.params,
                            self.watch_timeout_s):
                        self.apply(kind, obj)
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("%s: watch expired (410 Gone); relisting", self.name)
                continue
            except NotFound as err:
                if not self.missing_ok:
                    failures += 1
                    log.warning("%s: list/watch failed: %s", self.name, err)
                else:
                    if not self.has_synced or self.store:
                        log.info("%s: not served (CRD not installed?); checking again every "
                                 "%.0f s", self.name, self.missing_retry_s)
                    self.replace([])
                    await asyncio.sleep(self.missing_retry_s)
                    continue
            except ApiError as err:
                failures += 1
                log.warning("%s: list/watch failed: %s", self.name, err)
            except Exception:  # a decoding error or a handler's bug: relist after a pause
                failures += 1
                log.exception("%s: list/watch failed", self.name)
            base, cap = self.backoff_s
            await asyncio.sleep(min(cap, base * 2 ** min(failures, 10)) * random.uniform(0.5, 1))
