"""Watch-backed caches: list, then watch from the list's resourceVersion, relist on 410 Gone.

A `Reflector` feeds one resource kind into callbacks: `on_replace(all objects)` after every
(re)list, so the consumer can drop what disappeared while no watch was running, then
`on_event(type, object)` for each ADDED / MODIFIED / DELETED. `synced` is set after the first
list. Objects are handed over as plain dicts (the API's JSON form).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

Manifest = Mapping[str, Any]


def to_manifest(obj: Any) -> dict[str, Any]:
    """A lightkube object (typed model or generic resource) as the API's dict."""
    if isinstance(obj, dict):
        return obj
    result: dict[str, Any] = obj.to_dict()
    return result


class Reflector:
    def __init__(self, client: Any, resource: Any, *, name: str,
                 on_replace: Callable[[list[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None],
                 namespace: str | None = None, fields: dict[str, Any] | None = None,
                 chunk_size: int = 500, watch_timeout_s: int = 300) -> None:
        self.client = client
        self.resource = resource
        self.name = name
        self.on_replace = on_replace
        self.on_event = on_event
        self.namespace = namespace
        self.fields = fields
        self.chunk_size = chunk_size
        self.watch_timeout_s = watch_timeout_s
        self.synced = asyncio.Event()
        self.relists = 0

    def _scope(self) -> dict[str, Any]:
        scope: dict[str, Any] = {}
        if self.namespace is not None:
            scope["namespace"] = self.namespace
        if self.fields:
            scope["fields"] = self.fields
        return scope

    async def list_once(self) -> str:
        listing = self.client.list(self.resource, chunk_size=self.chunk_size, **self._scope())
        items = [to_manifest(obj) async for obj in listing]
        version = str(listing.resourceVersion)
        self.on_replace(items)
        self.relists += 1
        self.synced.set()
        return version

    async def run(self) -> None:
        from lightkube.core.exceptions import ApiError

        failures = 0
        while True:
            try:
                version = await self.list_once()
                failures = 0
                async for kind, obj in self.client.watch(
                        self.resource, resource_version=version,
                        server_timeout=self.watch_timeout_s, **self._scope()):
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.on_event(kind, to_manifest(obj))
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if err.status.code == 410:
                    log.info("%s watch expired (410 Gone); relisting", self.name)
                    continue
                failures += 1
                log.warning("%s list/watch failed: %s", self.name, err)
            except Exception as err:  # connection loss etc.: back off, relist
                failures += 1
                log.warning("%s list/watch failed: %s: %s", self.name, type(err).__name__, err)
            await asyncio.sleep(min(30.0, 0.2 * 2 ** min(failures, 8)) * random.uniform(0.5, 1))
