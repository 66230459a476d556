"""The DRA allocator's passes over its caches (no API: the informers' stores filled by hand,
pods through the watch's events, which index the pods that name claims), issue 41: which pods
it places, how, and which it leaves to kube-scheduler."""

from __future__ import annotations

from typing import Any, cast

from elastic_gpu.core.annotations import DRA_PLACEMENT, DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.claim_placement import WAITING_REASON
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS, device_classes
from elastic_gpu.core.dra.devices import node_slices
from elastic_gpu.core.model import Card
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.scheduler.dra_allocator import AllocatorSettings, DraAllocator


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}


def _claim(name: str, cls: str = CARD_CLASS, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "7"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": cls, "capacity": {"requests": {
                    "compute": "50", "memory": "8Gi"}}}}]}},
            "status": status}


def _pod(name: str, *, gated: bool = True, scheduler: str = "s") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [],
                            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}
    if gated:
        spec["schedulingGates"] = [{"name": DRA_PLACEMENT_GATE}]
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-01-01T00:00:0{name[-1]}Z"},
            "spec": spec}


def _allocator(pods: list[dict[str, Any]], claims: list[dict[str, Any]],
               classes: list[dict[str, Any]] | None = None) -> DraAllocator:
    alloc = DraAllocator(cast(Any, None), AllocatorSettings(("s",), "binpack"))
    cards = tuple(Card(i, f"GPU-{i}", "A100", 81920) for i in range(2))
    for node in ("a", "b"):
        for obj in node_slices(node, cards, generation=1):
            alloc.slices.store[obj["metadata"]["name"]] = obj
        alloc.nodes.store[node] = _node(node)
    for cls in classes if classes is not None else device_classes():
        alloc.classes.store[cls["metadata"]["name"]] = cls
    for pod in pods:
        alloc.pods.apply("ADDED", pod)
    for claim in claims:
        alloc.claims.store[f"ns/{claim['metadata']['name']}"] = claim
    return alloc


def test_a_pass_packs_gated_pods_and_holds_what_it_wrote_until_the_watch_shows_it() -> None:
    names = ["p1", "p2", "p3"]
    alloc = _allocator([_pod(n) for n in names], [_claim(n) for n in names])
    jobs = alloc.plan()
    assert [j.pod for j in jobs] == names and all(j.lift_gate for j in jobs)
    placed = [(c[2]["devices"]["results"][0]["pool"], c[2]["devices"]["results"][0]["device"])
              for j in jobs for c in j.claims]
    # binpack: two halves on one card, the third on the same node's other card
    assert placed[0] == placed[1] and placed[2][0] == placed[0][0] != placed[2]
    # while the writes are in flight, a second pass holds them (pending) and places no pod twice
    alloc._busy.update(j.uid for j in jobs)
    alloc.pods.apply("ADDED", _pod("p4"))
    alloc.claims.store["ns/p4"] = _claim("p4")
    (fourth,) = alloc.plan()
    result = fourth.claims[0][2]["devices"]["results"][0]
    assert (result["pool"], result["device"]) == placed[2]


def test_pods_of_other_schedulers_ungated_pods_and_waiting_templates_are_left_alone() -> None:
    template_pod = _pod("p3")
    template_pod["spec"]["resourceClaims"] = [{"name": "gpu",
                                               "resourceClaimTemplateName": "t"}]
    alloc = _allocator([_pod("p1", scheduler="other"), _pod("p2", gated=False), template_pod],
                       [_claim("p1"), _claim("p2")])
    assert alloc.plan() == []


def test_what_the_engine_does_not_place_is_ungated_for_kube_scheduler() -> None:
    opted = [{**c, "metadata": {**c["metadata"], "annotations": {DRA_PLACEMENT: "kube-scheduler"}}}
             if c["metadata"]["name"] == CARD_CLASS else c for c in device_classes()]
    alloc = _allocator([_pod("p1"), _pod("p2")], [_claim("p1", MIG_CLASS), _claim("p2")],
                       classes=opted)
    jobs = alloc.plan()
    assert [(j.pod, j.lift_gate, j.claims) for j in jobs] == [("p1", True, []),
                                                               ("p2", True, [])]


def test_an_allocation_anyone_wrote_is_held_and_a_pod_without_room_waits_gated() -> None:
    def taken(node: str) -> dict[str, Any]:
        return {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": node, "device": f"gpu-{i}"}
            for i in range(2)]}}}
    alloc = _allocator([_pod("p1"), _pod("p2")],
                       [_claim("p1"), _claim("p2"), _claim("xa", **taken("a"))])
    (job,) = [j for j in alloc.plan() if j.pod == "p1"]
    assert job.claims[0][2]["devices"]["results"][0]["pool"] == "b"  # a's cards are taken
    alloc = _allocator([_pod("p1")], [_claim("p1"), _claim("xa", **taken("a")),
                                      _claim("xb", **taken("b"))])
    assert alloc.plan() == []  # no room now: it stays gated
    huge = _claim("p1")
    huge["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "100Gi"
    alloc.claims.store["ns/p1"] = huge
    (job,) = alloc.plan()
    # no card could ever hold it: handed to kube-scheduler (which says why), once quiet
    assert job.lift_gate and job.handover and job.claims == []


def test_a_pod_whose_allocation_kube_scheduler_cleared_is_placed_again() -> None:
    alloc = _allocator([_pod("p1")], [_claim("p1")])
    (job,) = alloc.plan()
    # the gate lifted before the claim's watch shows the allocation: held, not placed again
    alloc.pods.apply("MODIFIED", _pod("p1", gated=False))
    assert alloc.plan() == []
    alloc.claims.store["ns/p1"] = {**_claim("p1"), "status": {
        "allocation": job.claims[0][2]}}
    assert alloc.plan() == []
    assert not alloc._pending  # seen back: the cache's allocation holds it now
    alloc.claims.store["ns/p1"] = _claim("p1")  # the allocation cleared
    (again,) = alloc.plan()
    assert again.claims and not again.lift_gate


def test_a_pass_looks_only_at_pods_that_name_claims_and_their_events_alone_wake_it() -> None:
    """Device-plugin pods (no resourceClaims) are never candidates: a pass does not walk them,
    and their watch events wake no pass (on a busy extender a pass per pod event walked every
    unbound pod)."""
    plain = {**_pod("p9"), "spec": {"schedulerName": "s", "containers": []}}
    alloc = _allocator([plain], [])
    assert not alloc._wake.is_set() and list(alloc._claimants) == []
    alloc.pods.apply("ADDED", _pod("p1"))
    assert alloc._wake.is_set() and list(alloc._claimants) == ["ns/p1"]
    alloc._wake.clear()
    alloc.pods.apply("MODIFIED", {**plain, "metadata": {**plain["metadata"],
                                                         "resourceVersion": "2"}})
    alloc.pods.apply("DELETED", plain)
    assert not alloc._wake.is_set()
    alloc.pods.apply("DELETED", _pod("p1"))  # bound: it leaves the unbound pods' watch
    assert alloc._wake.is_set() and list(alloc._claimants) == []


def test_the_nodes_watched_are_the_dra_mode_nodes_alone() -> None:
    alloc = DraAllocator(cast(Any, None), AllocatorSettings(("s",), "binpack"))
    assert alloc.nodes.params == {"labelSelector": "elasticgpu.io/gpu-mode=dra"}


def test_node_affinity_and_taints_narrow_the_nodes_as_kube_scheduler_would() -> None:
    alloc = _allocator([_pod("p1"), _pod("p2")], [_claim("p1"), _claim("p2")])
    # binpack would put both on one node; p1 (tolerating all) may not go to a by its affinity,
    # p2 tolerates a's taint and not b's
    alloc.nodes.store["a"]["spec"] = {"taints": [{"key": "gpu-pool", "value": "x",
                                                  "effect": "NoSchedule"}]}
    alloc.nodes.store["b"]["spec"] = {"taints": [{"key": "gpu-pool", "value": "y",
                                                  "effect": "NoExecute"},
                                                 {"key": "soft", "effect": "PreferNoSchedule"}]}
    alloc.pods.store["ns/p1"]["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                   "values": ["a"]}]}]}}}
    alloc.pods.store["ns/p1"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    alloc.pods.store["ns/p2"]["spec"]["tolerations"] = [
        {"key": "gpu-pool", "operator": "Equal", "value": "x", "effect": "NoSchedule"}]
    jobs = {j.pod: j for j in alloc.plan()}
    pools = {p: j.claims[0][2]["devices"]["results"][0]["pool"] for p, j in jobs.items()}
    assert pools == {"p1": "b", "p2": "a"}
    # a pod tolerating nothing fits no node now that both are tainted: nothing is allocated,
    # and it is handed to kube-scheduler, which says why on the pod (as for a nodeSelector
    # no DRA node matches)
    alloc = _allocator([_pod("p3")], [_claim("p3")])
    for node in ("a", "b"):
        alloc.nodes.store[node]["spec"] = {"taints": [{"key": "k", "effect": "NoExecute"}]}
    (job,) = alloc.plan()
    assert job.handover and job.claims == []
    # placement fields not of the API's shape: kube-scheduler's to refuse, naming why
    alloc = _allocator([_pod("p4")], [_claim("p4")])
    alloc.pods.store["ns/p4"]["spec"]["tolerations"] = "everything"
    (job,) = alloc.plan()
    assert job.handover and job.claims == []


class _Recorded(EventRecorder):
    def __init__(self) -> None:
        super().__init__(cast(Any, None), "test")
        self.seen: list[tuple[str, str, str, str]] = []

    def record(self, obj: Any, type_: str, reason: str, message: str) -> None:
        self.seen.append((f"{obj['kind']}/{obj['metadata']['name']}", type_, reason, message))


def test_a_pod_waiting_gated_for_room_gets_one_event_per_reason_not_one_per_pass() -> None:
    def taken(node: str, *devices: str) -> dict[str, Any]:
        return {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": node, "device": d}
            for d in devices]}}}
    alloc = _allocator([_pod("p1")], [_claim("p1"), _claim("xa", **taken("a", "gpu-0", "gpu-1")),
                                      _claim("xb", **taken("b", "gpu-0", "gpu-1"))])
    recorded = alloc.recorder = _Recorded()
    assert alloc.plan() == [] and alloc.plan() == []
    (event,) = recorded.seen
    assert event[:3] == ("Pod/p1", "Normal", WAITING_REASON)
    assert event[3].startswith("waiting, gated, for room on a DRA node: 0/2 nodes it may go to "
                               "can hold its claims now (2 × ")
    assert "(e.g. node a)" in event[3] and event[3].endswith("placed as soon as room frees")
    # another reason (the claim asks more now): one more Event
    alloc.claims.store["ns/p1"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"][
        "requests"]["compute"] = "60"
    assert alloc.plan() == [] and alloc.plan() == []
    assert len(recorded.seen) == 2 and recorded.seen[1][3] != event[3]
    # the pod goes (bound or deleted): forgotten
    alloc._forget(alloc.pods.store["ns/p1"])
    assert alloc._waiting == {}


def test_a_slice_changed_or_a_claim_released_reopens_kube_schedulers_turn() -> None:
    """The changes after which kube-scheduler retries the pods it found unschedulable reach
    the turn (`core.dra.turn`): a slice of ours whose spec changed, a claim of ours released;
    a slice's status-free update or an allocation written do not."""
    alloc = _allocator([], [])
    old = next(iter(alloc.slices.store.values()))
    alloc.slices.apply("MODIFIED", {**old, "metadata": {**old["metadata"], "resourceVersion": "2"}})
    assert alloc._turn.changed_at == float("-inf")
    carved = {**old, "metadata": {**old["metadata"], "resourceVersion": "3"},
              "spec": {**old["spec"], "devices": []}}
    alloc.slices.apply("MODIFIED", carved)
    assert alloc._turn.changed_at > float("-inf") and alloc._wake.is_set()
    alloc._turn.changed_at = float("-inf")
    held = _claim("c1", allocation={"devices": {"results": [
        {"driver": "gpu.elasticgpu.io", "pool": "a", "device": "gpu-0", "request": "gpu"}]}})
    alloc.claims.apply("ADDED", _claim("c1"))
    alloc.claims.apply("MODIFIED", held)  # allocated: nothing freed
    assert alloc._turn.changed_at == float("-inf")
    alloc.claims.apply("MODIFIED", _claim("c1"))  # deallocated
    assert alloc._turn.changed_at > float("-inf")
