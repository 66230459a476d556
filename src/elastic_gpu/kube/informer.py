"""The one list/watch loop (`Reflector`), and the informer that keeps its objects in a store.

Every watch in the project is this loop: the controller's informers (`Informer`, with a store
and add/update/delete handlers) and the scheduler's API worker (`Reflector` alone: raw
`on_page(items, first, last)` / `on_event(kind, object)` callbacks, no store, no copy: it
forwards each page of a list and each event as it came, and the per-event work is reading its
resourceVersion).

List, then watch from the list's resourceVersion:

- The watch asks for bookmarks, so a quiet collection's resourceVersion stays fresh and a
  re-watch after the server ends one (every `watch_timeout_s`) rarely meets 410.
- 410 Gone (or any broken list/watch, after a backoff) relists and *replaces* the store: an
  object deleted while nothing was watching is delivered to the handlers as a deletion, one
  that changed as an update, a new one as an add (client-go's Replace).
- `has_synced` (Informer) turns true after the first list has been delivered; handlers and
  callbacks run in the event loop, synchronously, and must not block (a controller's handler
  enqueues a key).
- Any other failure (the API unreachable, a decoding error, a handler's bug) is logged and the
  collection relisted after a backoff (`backoff_s`: base and cap, doubling, jittered).
- `missing_ok` (a CRD that may not be installed): a 404 on the list counts as an empty,
  synced collection (objects known are delivered as deletions) and the list is retried every
  `missing_retry_s`, so one uninstalled CRD does not hold back every controller's start.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from elastic_gpu.kube.transport import ApiStatusError, ListPage

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class ListWatcher(Protocol):
    """What the informer needs from a client (`kube.client.KubeClient` is one)."""

    async def list(self, path: str, params: Mapping[str, str] | None = None
                   ) -> tuple[list[Obj], str]: ...

    def list_pages(self, path: str, params: Mapping[str, str] | None = None, *,
                   shape: type[msgspec.Struct] | None = None) -> AsyncIterator[ListPage]: ...

    def watch(self, path: str, resource_version: str, params: Mapping[str, str] | None = None,
              timeout_s: int = 300, *, shape: type[msgspec.Struct] | None = None
              ) -> AsyncIterator[tuple[str, Obj]]: ...


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


def on_any_change(callback: Callable[[], None]) -> Handler:
    """A handler calling `callback` on every add, update and delete (a controller's round
    kicked by any change of its inputs)."""
    return Handler(on_add=lambda _o: callback(), on_update=lambda _o, _n: callback(),
                   on_delete=lambda _o: callback())


#: `on_page(items, first, last)`: one page of a (re)list (`Reflector`).
PageHandler = Callable[[list[Obj], bool, bool], None]


class Reflector:
    """One collection, listed and watched: `on_replace(all objects)` after every (re)list, then
    `on_event(kind, object)` for each ADDED / MODIFIED / DELETED (a BOOKMARK only moves the
    version). Objects are plain dicts as the API serves them, passed on as they are.

    With `on_page` instead of `on_replace`, a list is handed over page by page as the API
    serves it, `on_page(items, first, last)`: `first` begins a list (a list that broke off
    half-way, say on an expired continue token, is begun again: what came of it is void) and
    the pages from a `first` to its `last` are exactly the collection. Nothing then holds the
    whole list's objects as the API serves them (the scheduler's API worker keeps only a
    slim form of each)."""

    def __init__(self, client: ListWatcher, path: str, *, name: str,
                 on_event: Callable[[str, Obj], None],
                 on_replace: Callable[[list[Obj]], None] | None = None,
                 on_page: PageHandler | None = None,
                 shape: type[msgspec.Struct] | None = None,
                 params: Mapping[str, str] | None = None, watch_timeout_s: int = 300,
                 backoff_s: tuple[float, float] = (0.2, 30.0), missing_ok: bool = False,
                 missing_retry_s: float = 10.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        if (on_replace is None) == (on_page is None):
            raise ValueError("a Reflector takes one of on_replace and on_page")
        self.client = client
        self.path = path
        self.name = name
        self.on_replace = on_replace
        self.on_page = on_page
        #: with `on_page`: the fields a list page's items and a watch event's object decode
        #: (`RestClient.list_pages`, `RestClient.watch`); without one, objects come whole
        self.shape = shape
        self.on_event = on_event
        self.params = dict(params or {})
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.missing_ok = missing_ok
        self.missing_retry_s = missing_retry_s
        #: how the backoff and the missing-collection retry wait
        self._sleep = sleep
        self.relists = 0
        self.last_resource_version = ""
        #: Whether the last list found the collection served (False until one did, and after
        #: a 404 with `missing_ok`: its CRD is not installed).
        self.served = False

    def _log_missing(self) -> bool:
        """Whether a 404 (with `missing_ok`) is worth a log line now."""
        return True

    async def run(self) -> None:
        """List and watch until cancelled."""
        failures = 0
        while True:
            try:
                version = await self._list()
                self.served = True
                self.relists += 1
                self.last_resource_version = version
                failures = 0
                broken = 0
                while True:  # re-watch from the newest version seen until 410 or a failure
                    try:
                        async for kind, obj in self._watch():
                            seen = (obj.get("metadata") or {}).get("resourceVersion")
                            if seen:
                                self.last_resource_version = str(seen)
                            if kind in _CHANGES:
                                self.on_event(kind, obj)
                        broken = 0
                    except ApiStatusError as err:
                        # The connection broke (code 0: reset, timeout, refused) rather than
                        # the API refusing: resume from the version seen, as client-go's
                        # reflector does, instead of relisting the whole collection; after
                        # a few breaks in a row, relist after all.
                        if err.code != 0 or broken >= MAX_WATCH_RESUMES:
                            raise
                        broken += 1
                        log.info("%s: watch broke (%s); resuming from %s", self.name, err,
                                 self.last_resource_version)
                        base, cap = self.backoff_s
                        await self._sleep(min(cap, base * 2 ** broken)
                                            * random.uniform(0.5, 1))
            except asyncio.CancelledError:
                raise
            except ApiStatusError as err:  # kube.errors' classes are ApiStatusErrors too
                if err.code == 410:
                    log.info("%s: watch expired (410 Gone); relisting", self.name)
                    continue
                if err.code == 404 and self.missing_ok:
                    self.served = False
                    if self._log_missing():
                        log.info("%s: not served (CRD not installed?); checking again every "
                                 "%.0f s", self.name, self.missing_retry_s)
                    self._deliver_empty()
                    failures = 0
                    await self._sleep(self.missing_retry_s)
                    continue
                failures += 1
                log.warning("%s: list/watch failed: %s", self.name, err)
            except Exception:  # a decoding error or a handler's bug: relist after a pause
                failures += 1
                log.exception("%s: list/watch failed", self.name)
            base, cap = self.backoff_s
            await self._sleep(min(cap, base * 2 ** min(failures, 10)) * random.uniform(0.5, 1))


    def _watch(self) -> AsyncIterator[tuple[str, Obj]]:
        """The watch from the newest version seen; shaped only with a shape (a client
        without one, such as a test's, is called as before)."""
        if self.shape is None:
            return self.client.watch(self.path, self.last_resource_version, self.params,
                                     self.watch_timeout_s)
        return self.client.watch(self.path, self.last_resource_version, self.params,
                                 self.watch_timeout_s, shape=self.shape)

    async def _list(self) -> str:
        """List the collection and hand it over; returns the list's resourceVersion (the
        watch starts there: every page is of that one snapshot)."""
        if self.on_page is None:
            assert self.on_replace is not None
            items, version = await self.client.list(self.path, self.params)
            self.on_replace(items)
            return version
        first = True
        async for page in self.client.list_pages(self.path, self.params, shape=self.shape):
            self.on_page(page.items, first, page.last)
            first = False
            if page.last:
                return page.resource_version
        raise ApiStatusError(0, "", "the list ended without its last page")

    def _deliver_empty(self) -> None:
        if self.on_page is not None:
            self.on_page([], True, True)
        else:
            assert self.on_replace is not None
            self.on_replace([])


#: Broken watches in a row resumed from the last version before a relist.
MAX_WATCH_RESUMES = 3

#: The watch events delivered to `on_event` (a BOOKMARK only moves the version).
_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


class Informer(Reflector):
    """One collection, listed and watched (`Reflector`), kept in `store` (key -> object); its
    changes go to the handlers."""

    def __init__(self, client: ListWatcher, path: str, *, name: str,
                 params: Mapping[str, str] | None = None, watch_timeout_s: int = 300,
                 backoff_s: tuple[float, float] = (0.2, 30.0), missing_ok: bool = False,
                 missing_retry_s: float = 10.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        super().__init__(client, path, name=name, on_replace=self.replace, on_event=self.apply,
                         params=params, watch_timeout_s=watch_timeout_s, backoff_s=backoff_s,
                         missing_ok=missing_ok, missing_retry_s=missing_retry_s, sleep=sleep)
        self.store: dict[str, Obj] = {}
        self.handlers: list[Handler] = []
        self._synced = asyncio.Event()

    def _log_missing(self) -> bool:
        # once, and again after the collection was served with objects
        return not self.has_synced or bool(self.store)

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
