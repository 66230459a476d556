"""What one bind costs the state: one engine allocation (the reservation's), moved to the pod's
key when the Binding lands (`Engine.rekey`), nothing more when the watch reports the bound pod,
and no second reading of the pod's manifest. The state it leaves is the one a restarted
extender lists."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest

from egpu_testing.engine_calls import engine_calls, manifest_reads
from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag.reservation import DefragReservation
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.binder import bound_info, with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import PodInfo, SchedulerState

NODES = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "T4", 16384)
                                             for c in range(2))) for i in range(2)]


class WatchingApi:
    """The API worker as the bind path sees it. With `watch_first`, the watch's event of the
    bound pod reaches the state before the Binding's answer does (the two race)."""

    def __init__(self, state: SchedulerState, watch_first: bool = False) -> None:
        self.state = state
        self.watch_first = watch_first
        self.bound: dict[str, dict[str, Any]] = {}
        #: pods the state has not seen (uid -> manifest)
        self.unseen: dict[str, dict[str, Any]] = {}

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        pod = self.state.pod(uid)
        manifest = pod.manifest if pod is not None else self.unseen[uid]
        assert (manifest["metadata"]["resourceVersion"]) == str(resource_version)
        after = copy.deepcopy(dict(manifest))
        after["metadata"]["annotations"] = {**after["metadata"].get("annotations", {}),
                                            **annotations}
        after["metadata"]["resourceVersion"] = str((resource_version or 0) + 1)
        after["spec"]["nodeName"] = node
        self.bound[uid] = after
        if self.watch_first:
            self.state.observe_pod(after)


def pending(name: str) -> dict[str, Any]:
    pod = pod_manifest(name, uid=f"uid-{name}", containers={
        "main": {"elasticgpu.io/gpu-core": "30", "cpu": "2", "memory": "1Gi"}})
    pod["metadata"]["resourceVersion"] = "3"
    return pod


def running(pod: dict[str, Any]) -> dict[str, Any]:
    """The kubelet's (kwok's) status update of the bound pod: a newer version, nothing held
    changes."""
    later = copy.deepcopy(pod)
    later["metadata"]["resourceVersion"] = str(int(later["metadata"]["resourceVersion"]) + 1)
    later["status"] = {"phase": "Running"}
    return later


async def bind(extender: Extender, pod: Mapping[str, Any], node: str) -> str:
    meta = pod["metadata"]
    body = json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                       "PodUID": meta["uid"], "Node": node}).encode()
    response = await extender.bind(body)
    assert response.text is not None
    return str(json.loads(response.text)["Error"])


def ledger(state: SchedulerState) -> tuple[object, ...]:
    """What the state holds and what decisions read of it."""
    return (state.holds(), state.inflight(), state.card_usage(), state.host_usage(),
            state.engine.allocations(), {n: state.engine.host_usage(n) for n in state.node_names()})


@pytest.mark.parametrize("watch_first", [False, True], ids=["settle-first", "watch-first"])
async def test_a_bind_changes_the_engine_once_and_reads_the_pod_once(watch_first: bool) -> None:
    state = ready_state(NODES)
    api = WatchingApi(state, watch_first)
    extender = Extender(state, api)
    pod = pending("p")
    state.observe_pod(pod)  # as the pod watch delivers it
    with engine_calls(state.engine) as calls, manifest_reads() as reads:
        assert await bind(extender, pod, "n0") == ""
        read_by_bind = reads["from_manifest"] - (1 if watch_first else 0)
        bound = api.bound["uid-p"]
        state.observe_pod(bound)  # the watch's event of the Binding (again, if it came first)
        state.observe_pod(running(bound))
    # the reservation's allocation and its CPU, then the move to the pod's key: nothing
    # released and allocated again, nothing changed by the watch's events
    assert calls == {"allocate": 1, "set_outside_usage": 1, "rekey": 1}
    assert read_by_bind == 0  # the state's record of the pod, not a second reading
    # the state is the one a restarted extender lists
    assert ledger(state) == ledger(ready_state(NODES, pods=[running(bound)]))
    assert state.engine.host_usage("n0") == (2000, 1024)


async def test_a_pod_the_state_has_not_seen_is_read_once() -> None:
    state = ready_state(NODES)
    api = WatchingApi(state)
    extender = Extender(state, api)
    pod = pending("q")
    api.unseen["uid-q"] = pod
    extender.verbs.recent.remember("uid-q", pod)  # the filter request carried it; no watch event yet
    with manifest_reads() as reads:
        assert await bind(extender, pod, "n1") == ""
    assert reads["from_manifest"] == 1
    assert state.holds()["uid-q"].node == "n1"


def test_a_retry_s_reservation_is_released_and_the_landed_one_moved() -> None:
    state = ready_state(NODES)
    pod = pending("r")
    state.observe_pod(pod)
    request = pod_request_from_manifest(pod)
    first, _ = state.reserve(request, "uid-r", "n0")
    state.settle("uid-r", first, "unknown")
    second, landed = state.reserve(request, "uid-r", "n0")
    assert len(state.inflight()["uid-r"]) == 2
    with engine_calls(state.engine) as calls:
        state.settle("uid-r", second, "bound", with_binding(pod, "n0", landed))
    assert calls == {"release": 1, "set_outside_usage": 1, "rekey": 1}  # the first one's
    bound = with_binding(pod, "n0", landed)
    bound["metadata"]["resourceVersion"] = "4"
    assert ledger(state) == ledger(ready_state(NODES, pods=[bound]))


def test_the_watch_still_moves_what_changed() -> None:
    state = ready_state(NODES)
    pod = pending("s")
    state.observe_pod(pod)
    token, assignment = state.reserve(pod_request_from_manifest(pod), "uid-s", "n0")
    bound = with_binding(pod, "n0", assignment)
    state.settle("uid-s", token, "bound", bound)
    done = running(bound)
    done["status"] = {"phase": "Succeeded"}
    with engine_calls(state.engine) as calls:
        state.observe_pod(done)
    assert calls == {"release": 1, "set_outside_usage": 1}
    assert state.holds() == {} and state.host_usage()["n0"] == (0, 0)
    resized = running(bound)
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    other = ready_state(NODES)
    other.observe_pod(bound)
    with engine_calls(other.engine) as calls:
        other.observe_pod(resized)  # a new request: counted again (off, then on)
    assert calls == {"set_outside_usage": 2}
    assert other.host_usage()["n0"] == (3000, 1024)


def test_bound_info_is_what_reading_the_bound_manifest_gives() -> None:
    share = Assignment("n0", {"main": (CardShare(1, "GPU-0-1", 300, 2048),),
                              "side": (CardShare(0, "GPU-0-0", 1000, 0, replicas=1),)},
                       {"side": "egpu-1"})
    reserved = pending("t")
    reserved["metadata"]["annotations"] = {
        ann.DEFRAG_RESERVATION: DefragReservation(
            Assignment("n0", {"main": (CardShare(1, "GPU-0-1", 300, 2048),)}), 4e9).to_json(),
        ann.NODE_POLICY: "spread"}
    reserved["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    for pod in (pending("u"), reserved):
        known = PodInfo.from_manifest(pod)
        assert bound_info(known, "n0", share) == PodInfo.from_manifest(
            with_binding(pod, "n0", share))


async def test_filter_and_bind_read_a_watched_pods_requests_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter of the version the watch delivered reads the requests from the state's
    record, and the bind reuses that reading (`PodInfo.request`): one reading a pod, not
    one per verb. A filter body that names that version with other contents is decided on
    the record, as the bind is."""
    from elastic_gpu.scheduler import verbs
    from elastic_gpu.scheduler.state import records

    reads: list[str] = []

    def counted(pod: Mapping[str, Any]) -> Any:
        reads.append(pod["metadata"]["name"])
        return pod_request_from_manifest(pod)

    monkeypatch.setattr(records, "pod_request_from_manifest", counted)
    monkeypatch.setattr(verbs, "pod_request_from_manifest", counted)
    state = ready_state(NODES, SchedulerState(SchedulerConfig(filter_result="all")))  # both nodes answered
    extender = Extender(state, WatchingApi(state))
    pod = pending("v")
    state.observe_pod(pod)
    forged = copy.deepcopy(pod)  # the same uid and version, asking more than any card has
    forged["spec"]["containers"][0]["resources"]["limits"]["elasticgpu.io/gpu-core"] = "99"
    forged["spec"]["containers"][0]["resources"]["limits"]["elasticgpu.io/gpu-memory"] = "99999"
    for body in (pod, forged):
        answer = extender.filter(json.dumps({"Pod": body, "Nodes": None,
                                             "NodeNames": ["n0", "n1"]}).encode())
        assert answer.text is not None and json.loads(answer.text)["NodeNames"] == ["n0", "n1"]
    assert await bind(extender, pod, "n0") == ""
    assert reads == ["v"]
