"""JSON verbs over `kube.transport.RestClient` that raise the typed errors of `kube.errors`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from elastic_gpu.kube.errors import translate
from elastic_gpu.kube.transport import ApiStatusError, ListPage, RestClient

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
#: Built-in kinds only: lists merge by their patchMergeKey (kubectl patch's default).
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


__all__ = ["APPLY_PATCH", "JSON_PATCH", "MERGE_PATCH", "STRATEGIC_PATCH", "KubeClient"]



class KubeClient:
    """get / list / watch / create / update / patch / delete, objects as plain dicts."""

    def __init__(self, rest: RestClient, *, field_manager: str | None = None) -> None:
        self.rest = rest
        #: Named on every write (`fieldManager`), so managedFields say which component wrote.
        self.field_manager = field_manager

    @classmethod
    def from_config(cls, kubeconfig: Path | None, *, field_manager: str | None = None,
                    **kwargs: Any) -> KubeClient:
        """From a kubeconfig file, or the in-cluster service account when it is None (a
        `ClientConfigError` says what is wrong); kwargs go to the transport."""
        return cls(RestClient.from_config(kubeconfig, **kwargs), field_manager=field_manager)

    async def _call(self, method: str, path: str, body: Any = None,
                    params: Mapping[str, str] | None = None,
                    content_type: str = "application/json") -> dict[str, Any]:
        data = msgspec.json.encode(body) if body is not None else None
        if self.field_manager is not None and method in ("POST", "PUT", "PATCH"):
            params = {**(params or {}), "fieldManager": self.field_manager}
        try:
            raw = await self.rest.request(method, path, body=data, params=params,
                                          content_type=content_type)
        except ApiStatusError as err:
            raise translate(err) from None
        decoded: Any = msgspec.json.decode(raw) if raw else {}
        return decoded if isinstance(decoded, dict) else {}

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """`params`: e.g. `{"limit": "1"}` to read one page of a collection."""
        return await self._call("GET", path, params=params)

    async def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self._call("POST", path, obj)

    async def update(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT: the object's metadata.resourceVersion, if set, is a precondition (409)."""
        return await self._call("PUT", path, obj)

    async def patch(self, path: str, patch: Any, content_type: str = MERGE_PATCH,
                    params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """`params`: e.g. `{"force": "true"}` with APPLY_PATCH (server-side apply)."""
        return await self._call("PATCH", path, patch, params=params, content_type=content_type)

    async def delete(self, path: str, *, uid: str | None = None,
                     resource_version: str | None = None,
                     grace_period_s: int | None = None) -> dict[str, Any]:
        """DELETE with optional uid / resourceVersion preconditions (409 when they fail);
        `grace_period_s=0` deletes a pod at once."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version))
                         if v}
        if preconditions:
            options["preconditions"] = preconditions
        return await self._call("DELETE", path, options)

    async def list(self, path: str, params: Mapping[str, str] | None = None
                   ) -> tuple[list[dict[str, Any]], str]:
        try:
            return await self.rest.list(path, params)
        except ApiStatusError as err:
            raise translate(err) from None

    async def list_pages(self, path: str, params: Mapping[str, str] | None = None,
                         shape: type[msgspec.Struct] | None = None,
                         ) -> AsyncIterator[ListPage]:
        """The list page by page (`RestClient.list_pages`)."""
        try:
            async for page in self.rest.list_pages(path, params, shape=shape):
                yield page
        except ApiStatusError as err:
            raise translate(err) from None

    async def watch(self, path: str, resource_version: str,
                    params: Mapping[str, str] | None = None, timeout_s: int = 300, *,
                    shape: type[msgspec.Struct] | None = None,
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) events, BOOKMARK included; ERROR events raised as ApiError.
        `shape`: the fields each object decodes (`RestClient.watch`)."""
        try:
            async for event in self.rest.watch(path, resource_version, params, timeout_s,
                                               shape=shape):
                yield event
        except ApiStatusError as err:
            raise translate(err) from None

    async def close(self) -> None:
        await self.rest.close()
