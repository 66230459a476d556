"""`kube.sync.SyncKubeClient` (the agent's client) against a real API server: the verbs, the
typed errors a thread catches, an informer run in the client's loop thread, and close()."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.kube.client import APPLY_PATCH
from elastic_gpu.kube.errors import AlreadyExists, Conflict, NotFound
from elastic_gpu.kube.informer import Handler, Informer
from elastic_gpu.kube.paths import CORE, Resource
from elastic_gpu.kube.sync import SyncKubeClient

pytestmark = pytest.mark.integration

CONFIGMAPS = Resource(CORE, "configmaps", True)


def configmap(namespace: str, name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": data}


@pytest.fixture
def kube(k8s_cluster: Any) -> Iterator[SyncKubeClient]:
    with SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig),
                                    field_manager="egpu-test") as client:
        yield client


def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def test_verbs_and_their_typed_errors(kube: SyncKubeClient, k8s_namespace: str) -> None:
    path = CONFIGMAPS.path(k8s_namespace)
    made = kube.create(path, configmap(k8s_namespace, "one", a="1"))
    assert made["data"] == {"a": "1"}
    assert made["metadata"]["managedFields"][0]["manager"] == "egpu-test"
    with pytest.raises(AlreadyExists):
        kube.create(path, configmap(k8s_namespace, "one"))
    one = CONFIGMAPS.path(k8s_namespace, "one")
    assert kube.get(one)["data"] == {"a": "1"}
    stale = kube.get(one)
    kube.patch(one, {"data": {"b": "2"}})  # a merge patch
    with pytest.raises(Conflict) as err:
        kube.update(one, {**stale, "data": {"c": "3"}})  # resourceVersion is a precondition
    assert not isinstance(err.value, AlreadyExists)
    fresh = kube.get(one)
    assert kube.update(one, {**fresh, "data": {"c": "3"}})["data"] == {"c": "3"}
    applied = kube.patch(CONFIGMAPS.path(k8s_namespace, "two"),
                         configmap(k8s_namespace, "two", d="4"), APPLY_PATCH, {"force": "true"})
    assert applied["data"] == {"d": "4"}
    items, version = kube.list(path)
    assert {i["metadata"]["name"] for i in items} >= {"one", "two"} and version
    kube.delete(one)
    with pytest.raises(NotFound):
        kube.get(one)
    with pytest.raises(NotFound):
        kube.delete(one)


def test_an_informer_in_the_loop_thread_sees_add_update_delete(
        kube: SyncKubeClient, k8s_namespace: str) -> None:
    seen: list[tuple[str, str, str]] = []
    lock = threading.Lock()
    threads: set[str] = set()

    def note(kind: str) -> Callable[..., None]:
        def handler(*objs: dict[str, Any]) -> None:
            obj = objs[-1]
            with lock:
                threads.add(threading.current_thread().name)
                seen.append((kind, obj["metadata"]["name"], (obj.get("data") or {}).get("v", "")))
        return handler

    informer = Informer(kube.async_client, CONFIGMAPS.path(k8s_namespace), name="configmaps",
                        params={"fieldSelector": "metadata.name=watched"})
    informer.add_handler(Handler(on_add=note("add"), on_update=note("update"),
                                 on_delete=note("delete")))
    run = kube.run_informer(informer)
    eventually(lambda: informer.has_synced)
    path = CONFIGMAPS.path(k8s_namespace)
    kube.create(path, configmap(k8s_namespace, "watched", v="1"))
    kube.create(path, configmap(k8s_namespace, "ignored", v="1"))  # not selected
    kube.patch(CONFIGMAPS.path(k8s_namespace, "watched"), {"data": {"v": "2"}})
    kube.delete(CONFIGMAPS.path(k8s_namespace, "watched"))
    eventually(lambda: ("delete", "watched", "2") in seen)
    assert seen == [("add", "watched", "1"), ("update", "watched", "2"),
                    ("delete", "watched", "2")]
    assert threads == {"kube-loop"}  # the client's loop thread, not the caller's
    run.cancel()


def test_close_leaves_no_thread(k8s_cluster: Any) -> None:
    before = {t.ident for t in threading.enumerate()}
    client = SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig))
    client.list(CONFIGMAPS.path("default"))
    informer = Informer(client.async_client, CONFIGMAPS.path("default"), name="configmaps")
    client.run_informer(informer)
    eventually(lambda: informer.has_synced)
    client.close()
    client.close()  # a second close is harmless
    assert {t.ident for t in threading.enumerate()} <= before
