"""An Event recorder (core/v1 Events, what `kubectl describe` and `kubectl get events` show).

`record(obj, type, reason, message)` never blocks and never fails the caller: events go through
a bounded queue to a background sender; when the queue is full or the API refuses, the event
is dropped with a log line (a reconcile never waits on, or fails because of, an Event).
The same object + type + reason + message within `dedup_window_s` bumps the existing Event's
`count` and `lastTimestamp` (a PATCH) instead of creating another object, as client-go's
EventCorrelator does; a recurring condition is one Event with a count, not a flood.
Cluster-scoped objects' Events go to the `default` namespace, as Kubernetes files a PV's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.kube.client import MERGE_PATCH, KubeClient
from elastic_gpu.kube.errors import ApiError, NotFound
from elastic_gpu.kube.resources import EVENTS

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Sent:
    namespace: str
    name: str
    count: int
    at: float


@dataclass(frozen=True)
class _Pending:
    involved: dict[str, Any]
    namespace: str
    type: str
    reason: str
    message: str


def involved_object(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
           "name": meta.get("name", ""), "uid": meta.get("uid", "")}
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    return ref


class EventRecorder:
    def __init__(self, client: KubeClient, component: str, instance: str = "", *,
                 dedup_window_s: float = 600.0, max_queued: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        #: what the de-duplication window is measured with
        self._clock = clock
        self.component = component
        self.instance = instance
        self.dedup_window_s = dedup_window_s
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(max_queued)
        self._sent: dict[tuple[str, str, str, str], _Sent] = {}
        self.dropped = 0
        self.created = 0
        self.bumped = 0

    def record(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an Event about `obj` (an API object with apiVersion, kind, metadata)."""
        involved = involved_object(obj)
        namespace = involved.get("namespace") or "default"
        try:
            self._queue.put_nowait(_Pending(involved, namespace, type_, reason, message[:1024]))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("event queue full; dropped %s %s on %s", type_, reason, involved["name"])

    async def flush(self) -> None:
        """Wait until every queued event has been sent (or dropped)."""
        await self._queue.join()

    async def run(self) -> None:
        """Send queued events until cancelled."""
        while True:
            item = await self._queue.get()
            try:
                await self._send(item)
            except ApiError as err:
                self.dropped += 1
                log.warning("event %s on %s not written: %s", item.reason,
                            item.involved.get("name"), err)
            except Exception:
                self.dropped += 1
                log.exception("event %s not written", item.reason)
            finally:
                self._queue.task_done()

    async def _send(self, item: _Pending) -> None:
        key = (item.involved.get("uid") or item.involved["name"], item.type, item.reason,
               item.message)
        now = self._clock()
        self._expire(now)
        sent = self._sent.get(key)
        if sent is not None and now - sent.at <= self.dedup_window_s:
            patch = {"count": sent.count + 1, "lastTimestamp": _now()}
            try:
                await self.client.patch(EVENTS.path(sent.namespace, sent.name), patch, MERGE_PATCH)
                sent.count += 1
                sent.at = now
                self.bumped += 1
                return
            except NotFound:
                del self._sent[key]  # expired by the API server's TTL: make a new one
        stamp = _now()
        name = f"{item.involved['name']}.{uuid.uuid4().hex[:16]}"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": item.namespace},
            "involvedObject": item.involved, "type": item.type, "reason": item.reason,
            "message": item.message, "count": 1, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "source": {"component": self.component},
            "reportingComponent": self.component, "reportingInstance": self.instance,
        }
        await self.client.create(EVENTS.path(item.namespace), body)
        self.created += 1
        self._sent[key] = _Sent(item.namespace, name, 1, now)

    def _expire(self, now: float) -> None:
        if len(self._sent) < 4096:
            return
        for key in [k for k, s in self._sent.items() if now - s.at > self.dedup_window_s]:
            del self._sent[key]

    async def close(self) -> None:
        """Send what is queued (briefly), then stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), timeout=2.0)
