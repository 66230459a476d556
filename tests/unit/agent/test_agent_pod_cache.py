"""The node's pod watch cache (an informer run in the client's loop thread) against a scripted
API: list, watch from the list's resourceVersion, events applied in order, 410 Gone relists,
a watch the server ends resumes from the last resourceVersion."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

from elastic_gpu.agent.pods import PodCache
from elastic_gpu.kube.errors import Gone
from elastic_gpu.kube.sync import SyncKubeClient


def obj(name: str, rv: int, phase: str = "Pending") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "resourceVersion": str(rv),
                     "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
        "spec": {"nodeName": "n1"}, "status": {"phase": phase}}


class ScriptedApi:
    """list() answers the next listing; watch() plays the next script: events, then an
    exception (or a clean end: the server closing the watch)."""

    def __init__(self, listings: list[tuple[list[dict[str, Any]], str]],
                 watches: list[tuple[list[tuple[str, dict[str, Any]]], Exception | None]]):
        self.listings = listings
        self.watches = watches
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[dict[str, Any]] = []
        self.done = threading.Event()

    async def list(self, path: str, params: Mapping[str, str] | None = None
                   ) -> tuple[list[dict[str, Any]], str]:
        self.list_calls.append({"path": path, "params": dict(params or {})})
        return self.listings.pop(0)

    async def watch(self, path: str, resource_version: str,
                    params: Mapping[str, str] | None = None, timeout_s: int = 300
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watch_calls.append({"path": path, "params": dict(params or {}),
                                 "resource_version": resource_version})
        if not self.watches:
            self.done.set()
            await asyncio.sleep(3600)  # an idle stream
        events, error = self.watches.pop(0)
        for event in events:
            yield event
        if error is not None:
            raise error

    async def close(self) -> None:
        return None


def client(api: ScriptedApi) -> SyncKubeClient:
    return SyncKubeClient(lambda: api)  # type: ignore[arg-type,return-value]


def gone() -> Gone:
    return Gone(410, "Expired", "too old resource version: 5 (90)")


def names(cache: PodCache) -> set[str]:
    return {p["metadata"]["name"] for p in cache.pods()}


def test_list_then_watch_from_its_version_then_relist_on_410_and_resume_after_a_closed_watch(
        ) -> None:
    api = ScriptedApi(
        listings=[([obj("a", 3), obj("b", 4)], "5"), ([obj("c", 95)], "100")],
        watches=[
            ([("ADDED", obj("d", 6)), ("MODIFIED", obj("a", 7, "Running")),
              ("DELETED", obj("b", 8)), ("BOOKMARK", obj("", 9))], gone()),
            ([("ADDED", obj("e", 101))], None),
            ([("ADDED", obj("f", 102))], None),
        ])
    with client(api) as kube:
        cache = PodCache(kube, "n1", backoff_s=0.01, max_backoff_s=0.02)
        cache.start()
        assert cache.wait_synced(5)
        assert api.done.wait(5)
        cache.stop()
    # the field selector is the node's, on every request, across namespaces
    assert all(call["params"] == {"fieldSelector": "spec.nodeName=n1"}
               and call["path"] == "/api/v1/pods"
               for call in api.list_calls + api.watch_calls)
    # watch 1 from the first list's version; 410 -> relist; watch 2 from the relist's
    # version; the server ending it -> watch 3 from the last event's version (no relist)
    assert [c["resource_version"] for c in api.watch_calls] == ["5", "100", "101", "102"]
    assert cache.relists == 2
    # the relist replaced the state: a, b, d are gone (not seen in the new list), c e f came
    assert names(cache) == {"c", "e", "f"} and cache.resource_version == "102"


def test_events_are_applied_in_order_and_wake_waiters() -> None:
    api = ScriptedApi(listings=[([obj("a", 3), obj("b", 4)], "5")],
                      watches=[([("MODIFIED", obj("a", 7, "Running")), ("DELETED", obj("b", 8)),
                                 ("BOOKMARK", obj("", 9))], None)])
    with client(api) as kube:
        cache = PodCache(kube, "n1")
        seen = cache.version
        cache.start()
        assert api.done.wait(5)
        assert cache.wait_change(seen, 1) != seen
        cache.stop()
    (pod,) = cache.pods()
    assert pod["metadata"]["name"] == "a" and pod["status"]["phase"] == "Running"
    assert "managedFields" not in pod["metadata"]  # not kept: nothing reads it
    assert cache.resource_version == "9"  # the bookmark moves the version, not the pods


def test_stop_and_close_leave_no_thread() -> None:
    api = ScriptedApi(listings=[([obj("a", 3)], "5")], watches=[])
    before = set(threading.enumerate())
    kube = client(api)
    cache = PodCache(kube, "n1")
    cache.start()
    assert cache.wait_synced(5) and names(cache) == {"a"}
    cache.stop()
    kube.close()
    assert set(threading.enumerate()) <= before
