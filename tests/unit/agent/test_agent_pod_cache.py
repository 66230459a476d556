"""The node's pod watch cache (a reflector) against a scripted API: list, watch from the
list's resourceVersion, events applied in order, 410 Gone relists, errors back off and
resume from the last resourceVersion."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import Status

from elastic_gpu.agent.pods import PodCache, raw_pods


def obj(name: str, rv: int, phase: str = "Pending") -> Any:
    return raw_pods().from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "resourceVersion": str(rv),
                     "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
        "spec": {"nodeName": "n1"}, "status": {"phase": phase}})


class Listing(list[Any]):
    def __init__(self, items: list[Any], rv: str) -> None:
        super().__init__(items)
        self.resourceVersion = rv


class ScriptedApi:
    """list() answers the next listing; watch() plays the next script: events, then an
    exception (or a clean end)."""

    def __init__(self, listings: list[Listing], watches: list[tuple[list[Any], Exception | None]]):
        self.listings = listings
        self.watches = watches
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[dict[str, Any]] = []
        self.done = threading.Event()

    def list(self, res: Any, **kwargs: Any) -> Listing:
        self.list_calls.append(kwargs)
        return self.listings.pop(0)

    def watch(self, res: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        self.watch_calls.append(kwargs)
        if not self.watches:
            self.done.set()
            time.sleep(3600)  # an idle stream
        events, error = self.watches.pop(0)
        yield from events
        if error is not None:
            raise error


def gone() -> ApiError:
    return ApiError(status=Status(code=410, message="too old resource version: 5 (90)"))


def names(cache: PodCache) -> set[str]:
    return {p["metadata"]["name"] for p in cache.pods()}


def test_list_then_watch_from_its_version_then_relist_on_410_and_resume_after_errors() -> None:
    api = ScriptedApi(
        listings=[Listing([obj("a", 3), obj("b", 4)], "5"), Listing([obj("c", 95)], "100")],
        watches=[
            ([("ADDED", obj("d", 6)), ("MODIFIED", obj("a", 7, "Running")),
              ("DELETED", obj("b", 8)), ("BOOKMARK", obj("", 9))], gone()),
            ([("ADDED", obj("e", 101))], ConnectionError("reset by peer")),
            ([("ADDED", obj("f", 102))], None),
        ])
    cache = PodCache(api, "n1", backoff_s=0.01, max_backoff_s=0.02)
    cache.start()
    assert cache.wait_synced(5)
    assert api.done.wait(5)
    cache.stop()
    # the field selector is the node's, on every request
    assert all(call["fields"] == {"spec.nodeName": "n1"}
               for call in api.list_calls + api.watch_calls)
    # watch 1 from the first list's version; 410 -> relist; watch 2 from the relist's
    # version; the connection error -> watch 3 from the last event's version (no relist)
    assert [c["resource_version"] for c in api.watch_calls] == ["5", "100", "101", "102"]
    assert cache.relists == 2
    # the relist replaced the state: a, b, d are gone (not seen in the new list), c e f came
    assert names(cache) == {"c", "e", "f"} and cache.resource_version == "102"


def test_events_are_applied_in_order_and_wake_waiters() -> None:
    api = ScriptedApi(listings=[Listing([obj("a", 3), obj("b", 4)], "5")],
                      watches=[([("MODIFIED", obj("a", 7, "Running")), ("DELETED", obj("b", 8)),
                                 ("BOOKMARK", obj("", 9))], None)])
    cache = PodCache(api, "n1")
    seen = cache.version
    cache.start()
    assert api.done.wait(5)
    assert cache.wait_change(seen, 1) != seen
    cache.stop()
    (pod,) = cache.pods()
    assert pod["metadata"]["name"] == "a" and pod["status"]["phase"] == "Running"
    assert "managedFields" not in pod["metadata"]  # not kept: nothing reads it
    assert cache.resource_version == "9"  # the bookmark moves the version, not the pods
