"""One Lease behind the part of `KubeClient` that `kube.leaderelection.LeaderElector` uses
(get, create, update with the resourceVersion precondition, watch), on a `ManualClock`: a
request can be made to take time (`latency_s`, the clock moved while it is in flight) or to
fail (`down`), so a test sees what the elector decides on its own clock."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping
from typing import Any

from egpu_testing.clock import ManualClock
from elastic_gpu.kube.errors import Conflict, NotFound, ServerError


class LeaseApi:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.lease: dict[str, Any] | None = None
        self.version = 0
        #: how long the next requests take (the clock moves by this before each answers)
        self.latency_s = 0.0
        #: True: every request fails (the API server unreachable)
        self.down = False
        #: the verbs asked, in order
        self.requests: list[str] = []

    async def _request(self, verb: str) -> None:
        self.requests.append(verb)
        await asyncio.sleep(0)
        self.clock.advance(self.latency_s)
        if self.down:
            raise ServerError(503, "ServiceUnavailable", "the API server is down")

    async def get(self, path: str) -> dict[str, Any]:
        await self._request("get")
        if self.lease is None:
            raise NotFound(404, "NotFound", path)
        return copy.deepcopy(self.lease)

    async def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        await self._request("create")
        return self._write(obj)

    async def update(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        await self._request("update")
        sent = (obj.get("metadata") or {}).get("resourceVersion")
        if self.lease is None or sent != self.lease["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        return self._write(obj)

    def take(self, holder: str) -> None:
        """Another candidate writes the Lease as its own."""
        assert self.lease is not None
        self._write({**self.lease, "spec": {**self.lease["spec"], "holderIdentity": holder}})

    def _write(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.version += 1
        written = copy.deepcopy(dict(obj))
        written.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        self.lease = written
        return copy.deepcopy(written)

    async def watch(self, path: str, version: str,
                    params: Mapping[str, str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await asyncio.Event().wait()  # no events: the elector's attempts observe the Lease
        yield "MODIFIED", {}
