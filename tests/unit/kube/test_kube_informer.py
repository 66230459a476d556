"""The informer's store and handlers: watch events, bookmarks, and a relist after 410 that
replaces the store (deletions missed while not watching are delivered)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from elastic_gpu.kube.errors import Gone, ServerError
from elastic_gpu.kube.informer import Handler, Informer


def obj(name: str, rv: str, ns: str = "n") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}}


class FakeApi:
    """Scripted lists and watches: each list returns the next listing, each watch replays the
    next script of events (then raises what it ends with)."""

    def __init__(self, listings: list[tuple[list[dict[str, Any]], str]],
                 watches: list[tuple[list[tuple[str, dict[str, Any]]], Exception | None]]) -> None:
        self.listings = listings
        self.watches = watches
        self.watched_from: list[str] = []
        self.done = asyncio.Event()

    async def list(self, path: str, params: Mapping[str, str] | None = None
                   ) -> tuple[list[dict[str, Any]], str]:
        return self.listings.pop(0)

    async def watch(self, path: str, resource_version: str,
                    params: Mapping[str, str] | None = None, timeout_s: int = 300
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(resource_version)
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()
        events, end = self.watches.pop(0)
        for event in events:
            yield event
        if end is not None:
            raise end


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def handler(self) -> Handler:
        def name(o: dict[str, Any]) -> str:
            return f"{o['metadata']['name']}@{o['metadata']['resourceVersion']}"
        return Handler(on_add=lambda o: self.seen.append(("add", name(o))),
                       on_update=lambda old, new: self.seen.append(("update", name(new))),
                       on_delete=lambda o: self.seen.append(("delete", name(o))))


async def run_until_done(api: FakeApi, informer: Informer) -> None:
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(api.done.wait(), 5)
    task.cancel()


async def test_relist_after_410_replaces_the_store_and_delivers_missed_deletions() -> None:
    api = FakeApi(
        listings=[([obj("a", "1"), obj("b", "2")], "2"),
                  ([obj("b", "7"), obj("c", "8")], "9")],   # a deleted, b changed, c new
        watches=[([("ADDED", obj("d", "3")), ("BOOKMARK", {"metadata": {"resourceVersion": "5"}})],
                  Gone(410, "Expired", "too old"))])
    informer = Informer(api, "/x", name="x")
    rec = Recorder()
    informer.add_handler(rec.handler())
    assert not informer.has_synced
    await run_until_done(api, informer)
    assert informer.has_synced
    assert rec.seen == [("add", "a@1"), ("add", "b@2"), ("add", "d@3"),
                        ("delete", "a@1"), ("delete", "d@3"), ("update", "b@7"), ("add", "c@8")]
    assert sorted(informer.store) == ["n/b", "n/c"]
    # watched from the list's version, then (after the relist) from the new list's version
    assert api.watched_from == ["2", "9"]
    assert informer.relists == 2


async def test_rewatch_continues_from_the_last_event_or_bookmark() -> None:
    api = FakeApi(
        listings=[([obj("a", "1")], "1")],
        watches=[([("MODIFIED", obj("a", "4")), ("BOOKMARK", {"metadata": {"resourceVersion": "6"}})],
                  None),  # the server ended the watch normally
                 ([("DELETED", obj("a", "8"))], None)])
    informer = Informer(api, "/x", name="x")
    rec = Recorder()
    informer.add_handler(rec.handler())
    await run_until_done(api, informer)
    assert api.watched_from == ["1", "6", "8"]
    assert rec.seen == [("add", "a@1"), ("update", "a@4"), ("delete", "a@8")]
    assert informer.store == {} and informer.relists == 1


async def test_a_broken_watch_relists_after_a_backoff() -> None:
    api = FakeApi(
        listings=[([obj("a", "1")], "1"), ([obj("a", "1")], "3")],
        watches=[([], ServerError(500, "", "boom"))])
    informer = Informer(api, "/x", name="x", backoff_s=(0.001, 0.01))
    rec = Recorder()
    informer.add_handler(rec.handler())
    await run_until_done(api, informer)
    assert informer.relists == 2
    assert rec.seen == [("add", "a@1")]  # unchanged on relist: no spurious update
