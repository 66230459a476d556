"""Lists page by page on the real API server (`Reflector(on_page=...)`, the API worker's way):
a list of more objects than one page arrives complete and the watch starts at its version; a
continue token that expired (etcd compacted past the list's snapshot: 410 Expired) begins
the list again; the API worker and its link assemble the pages into one replace."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.cluster import TestCluster
from egpu_testing.pytest_plugin import unique_name
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.kube.informer import Reflector
from elastic_gpu.kube.resources import CORE, NAMESPACES, Resource
from elastic_gpu.kube.transport import LIST_PAGE, RestClient

pytestmark = pytest.mark.integration

CONFIGMAPS = Resource(CORE, "configmaps", True)

#: More than two pages: a first, a middle and a last one.
OBJECTS = 2 * LIST_PAGE + 17


def _fill(plane: ControlPlane, namespace: str, count: int, prefix: str = "cm") -> set[str]:
    kube = plane.kube()
    names = {f"{prefix}-{i:04d}" for i in range(count)}
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda name: kube.create(CONFIGMAPS.path(namespace), {
            "metadata": {"name": name}, "data": {"k": name}}), sorted(names)))
    return names


class Pages:
    """What a reflector handed over: each page as (first, last, names), and the events."""

    def __init__(self) -> None:
        self.pages: list[tuple[bool, bool, list[str]]] = []
        self.events: list[tuple[str, str]] = []
        self.listed = asyncio.Event()
        self.hook: Any = None

    def on_page(self, items: list[dict[str, Any]], first: bool, last: bool) -> None:
        self.pages.append((first, last, [o["metadata"]["name"] for o in items]))
        if self.hook is not None:
            self.hook(len(self.pages))
        if last:
            self.listed.set()

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, obj["metadata"]["name"]))

    def last_list(self) -> list[str]:
        """The names of the newest complete list: its pages from its `first` to its `last`."""
        start = max(i for i, (first, _, _) in enumerate(self.pages) if first)
        assert self.pages[-1][1], "the list has not ended"
        return [name for _, _, names in self.pages[start:] for name in names]


async def _until(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_list_longer_than_a_page_arrives_complete_and_the_watch_starts_at_it(
        k8s_cluster: ControlPlane, k8s_namespace: str) -> None:
    names = _fill(k8s_cluster, k8s_namespace, OBJECTS)
    got = Pages()
    client = RestClient.from_config(k8s_cluster.kubeconfig)
    reflector = Reflector(client, CONFIGMAPS.path(k8s_namespace), name="configmaps",
                          on_page=got.on_page, on_event=got.on_event)
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(got.listed.wait(), 60)
        assert [(first, last) for first, last, _ in got.pages] == [
            (True, False), (False, False), (False, True)]
        listed = got.last_list()
        assert [len(n) for _, _, n in got.pages] == [LIST_PAGE, LIST_PAGE,
                                                     len(listed) - 2 * LIST_PAGE]
        assert len(listed) == len(set(listed))  # no object twice
        # (the namespace's kube-root-ca.crt, published by kube-controller-manager, too)
        assert set(listed) - {"kube-root-ca.crt"} == names
        # The watch starts at the list's version: nothing listed comes again as an event,
        # and a change after the list does.
        k8s_cluster.kube().create(CONFIGMAPS.path(k8s_namespace),
                                  {"metadata": {"name": "after"}, "data": {}})
        await _until(lambda: ("ADDED", "after") in got.events)
        assert [e for e in got.events if e[1] in names] == []
        assert reflector.relists == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def _etcd(plane: ControlPlane, call: str, body: dict[str, Any]) -> dict[str, Any]:
    """etcd's JSON gateway (v3 API over HTTP), e.g. `kv/compaction`."""
    request = urllib.request.Request(f"http://127.0.0.1:{plane.etcd_port}/v3/{call}",
                                     data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


@pytest.fixture(scope="module")
def etcd_paged_plane(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A control plane whose continued list pages are read from etcd. With the default
    ListFromCacheSnapshot the watch cache serves them from a snapshot it keeps, and a
    compaction does not expire a token at once; from etcd (that gate off, or a cache that
    no longer holds the snapshot) a compaction past the list's revision does: 410 Expired."""
    plane = TestCluster(work_dir=Path(tmp_path_factory.mktemp("k8s-paged")),
                        die_with_parent=True,
                        apiserver_args=("--feature-gates=ListFromCacheSnapshot=false",))
    plane.start(scheduler=False, kwok_enabled=False, controller_manager=False)
    try:
        yield plane
    finally:
        plane.stop()


async def test_an_expired_continue_token_begins_the_list_again(
        etcd_paged_plane: ControlPlane) -> None:
    plane = etcd_paged_plane
    namespace = unique_name("paged")
    plane.kube().create(NAMESPACES.path(), {"metadata": {"name": namespace}})
    names = _fill(plane, namespace, OBJECTS)
    got = Pages()

    def compact_after_the_first_page(pages: int) -> None:
        if pages != 1:
            return
        # A change, then compaction up to it: the first page's snapshot is history now.
        plane.kube().create(CONFIGMAPS.path(namespace), {"metadata": {"name": "late"}})
        revision = int(_etcd(plane, "kv/range", {"key": "AA=="})["header"]["revision"])
        _etcd(plane, "kv/compaction", {"revision": str(revision), "physical": True})

    got.hook = compact_after_the_first_page
    client = RestClient.from_config(plane.kubeconfig)
    reflector = Reflector(client, CONFIGMAPS.path(namespace), name="configmaps",
                          on_page=got.on_page, on_event=got.on_event, backoff_s=(0.05, 0.5))
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(got.listed.wait(), 60)
        firsts = [i for i, (first, _, _) in enumerate(got.pages) if first]
        assert firsts == [0, 1]  # the first page, then the list begun again after the 410
        listed = got.last_list()
        assert len(listed) == len(set(listed))
        assert set(listed) == names | {"late"}  # the new list's snapshot has the late one
        assert reflector.relists == 1
        # and the watch runs from the new list's version
        plane.kube().create(CONFIGMAPS.path(namespace), {"metadata": {"name": "after"}})
        await _until(lambda: ("ADDED", "after") in got.events)
        assert ("ADDED", "late") not in got.events
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
