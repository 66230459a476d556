"""Issue 41, kube-scheduler's turn (`core.dra.turn`): which pods kube-scheduler may be
allocating one of our cards for, so our allocator lifts no gate until they are done."""

from __future__ import annotations

from typing import Any

from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.turn import asks_extended, in_kube_schedulers_hands, may_enter


def _pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "team"},
            "spec": {"containers": [{"name": "main"}], **spec}}


def _extended(count: str = "1", kind: str = "limits") -> dict[str, Any]:
    return _pod(containers=[{"name": "main", "resources": {kind: {"nvidia.com/gpu": count}}}])


def _claim_pod() -> dict[str, Any]:
    return _pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "c"}])


def _claim(cls: str, allocated: bool = False) -> dict[str, Any]:
    claim: dict[str, Any] = {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": cls}}]}}}
    if allocated:
        claim["status"] = {"allocation": {"devices": {"results": []}}}
    return claim


def _none(_key: str) -> None:
    return None


def test_a_pod_asking_nvidia_gpu_is_in_kube_schedulers_hands_until_its_claim_is_made() -> None:
    pod = _extended()
    assert asks_extended(pod) and asks_extended(_extended(kind="requests"))
    assert not asks_extended(_extended("0")) and not asks_extended(_pod())
    assert in_kube_schedulers_hands(pod, _none)
    made = {**pod, "status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-x"}}}
    assert not in_kube_schedulers_hands(made, _none)


def test_gated_bound_deleted_and_unschedulable_pods_are_not() -> None:
    pod = _extended()
    gated = {**pod, "spec": {**pod["spec"], "schedulingGates": [{"name": DRA_PLACEMENT_GATE}]}}
    bound = {**pod, "spec": {**pod["spec"], "nodeName": "n1"}}
    deleted = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert not any(may_enter(p) for p in (gated, bound, deleted))
    unschedulable = {**pod, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    assert may_enter(unschedulable) and not in_kube_schedulers_hands(unschedulable, _none)


def test_a_claim_pod_is_while_a_claim_of_our_card_class_is_unallocated() -> None:
    pod = _claim_pod()
    assert may_enter(pod)

    def reader(claim: dict[str, Any]) -> Any:
        return lambda key: claim if key == "team/c" else None
    assert in_kube_schedulers_hands(pod, reader(_claim(CARD_CLASS)))
    assert not in_kube_schedulers_hands(pod, reader(_claim(CARD_CLASS, allocated=True)))
    # our allocator places MIG instances too: a MIG claim races for them as well
    assert in_kube_schedulers_hands(pod, reader(_claim(MIG_CLASS)))
    assert not in_kube_schedulers_hands(pod, reader(_claim("other.example.com")))
    assert not in_kube_schedulers_hands(pod, _none)  # its claim not made yet


def test_the_turn_waits_for_such_pods_a_bounded_time_and_forgets_those_served() -> None:
    from elastic_gpu.core.dra.turn import ANSWER_S, Turn

    pods = {"team/gpu": {**_extended(), "metadata": {"name": "gpu", "namespace": "team"}},
            "team/p": _claim_pod()}
    claims: dict[str, Any] = {"team/c": _claim(CARD_CLASS)}
    turn = Turn(turn_s=5.0)
    for key, pod in pods.items():
        turn.seen(key, pod, 0.0)
    turn.seen("team/plain", _pod(), 0.0)  # asks no GPU: never tracked
    assert sorted(turn.since) == ["team/gpu", "team/p"]
    assert turn.busy(1.0, pods.get, claims.get)
    # its claim made and the other pod's allocated: served for good, forgotten
    pods["team/gpu"] = {**pods["team/gpu"], "status": {
        "extendedResourceClaimStatus": {"resourceClaimName": "gpu-x"}}}
    claims["team/c"] = _claim(CARD_CLASS, allocated=True)
    assert turn.busy(1.0 + ANSWER_S / 2, pods.get, claims.get)  # one answer per ANSWER_S
    assert not turn.busy(2.0, pods.get, claims.get)
    assert sorted(turn.since) == ["team/gpu"]  # still unbound: kept until turn_s
    # one that never gets an answer counts for turn_s at most, then is forgotten
    pods["team/gpu"] = _extended()
    assert turn.busy(4.0, pods.get, claims.get)
    assert not turn.busy(5.0, pods.get, claims.get) and turn.since == {}
    # bound or deleted: gone
    turn.seen("team/gpu", pods["team/gpu"], 6.0)
    turn.gone("team/gpu")
    assert turn.since == {}


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


def _held(driver: str = "gpu.elasticgpu.io") -> dict[str, Any]:
    return {**_claim(MIG_CLASS), "status": {"allocation": {"devices": {"results": [
        {"driver": driver, "pool": "n1", "device": "gpu-0-mig-6-1g-10gb", "request": "gpu"}]}}}}


def test_the_changes_that_make_kube_scheduler_retry_an_unschedulable_pod() -> None:
    from elastic_gpu.core.dra.turn import retries_on_claim, retries_on_slice

    mine = {"spec": {"driver": "gpu.elasticgpu.io", "devices": [{"name": "gpu-0"}]}}
    carved = {"spec": {**mine["spec"], "devices": [{"name": "gpu-0-mig-6-1g-10gb"}]}}
    assert retries_on_slice(None, mine) and retries_on_slice(mine, carved)
    assert not retries_on_slice(mine, {**mine, "metadata": {"resourceVersion": "2"}})
    assert not retries_on_slice(None, {"spec": {"driver": "other.example.com"}})
    assert retries_on_claim(_held(), _claim(MIG_CLASS)) and retries_on_claim(_held(), None)
    assert not retries_on_claim(_claim(MIG_CLASS), _held())  # allocated: nothing freed
    assert not retries_on_claim(_held("other.example.com"), None)
    assert not retries_on_claim(_held(), _held())


def test_an_unschedulable_pod_is_in_kube_schedulers_hands_for_turn_s_after_a_retry() -> None:
    """The sandbox's race: a handed-over MIG claim's pod found unschedulable is retried by
    kube-scheduler when a carve publishes an instance; our lift waits for it."""
    from elastic_gpu.core.dra.turn import Turn

    pods = {"team/p": _unschedulable(_claim_pod()),
            "team/gpu": _unschedulable({**_extended(), "metadata": {"name": "gpu",
                                                                     "namespace": "team"}})}
    claims: dict[str, Any] = {"team/c": _claim(MIG_CLASS)}
    turn = Turn(turn_s=5.0)
    for key, pod in pods.items():
        turn.seen(key, pod, 0.0)
    assert not turn.busy(1.0, pods.get, claims.get)  # found unschedulable: not waited for
    turn.changed(1.0)  # a slice of ours changed (an instance carved)
    assert turn.busy(1.0, pods.get, claims.get)  # answered anew at once
    assert turn.busy(5.9, pods.get, claims.get)
    assert not turn.busy(6.0, pods.get, claims.get)  # turn_s after the change, no answer
    turn.changed(7.0)  # a claim of ours released: again
    assert turn.busy(7.5, pods.get, claims.get)
    # ends early: its claim allocated, the other pod's extended claim made
    claims["team/c"] = _claim(MIG_CLASS, allocated=True)
    pods["team/gpu"] = {**pods["team/gpu"], "status": {
        **pods["team/gpu"]["status"], "extendedResourceClaimStatus": {"resourceClaimName": "x"}}}
    assert not turn.busy(8.0, pods.get, claims.get)
    # bound, gone: forgotten
    claims["team/c"] = _claim(MIG_CLASS)
    bound = {**pods["team/p"], "spec": {**pods["team/p"]["spec"], "nodeName": "n1"}}
    turn.seen("team/p", bound, 8.5)
    turn.gone("team/gpu")
    turn.changed(9.0)
    assert not turn.busy(9.0, pods.get, claims.get) and turn.unschedulable == set()


def test_only_pods_asking_our_classes_wait_after_a_retry() -> None:
    from elastic_gpu.core.dra.turn import Turn

    pods = {"team/p": _unschedulable(_claim_pod())}
    claims: dict[str, Any] = {"team/c": _claim("other.example.com")}
    turn = Turn(turn_s=5.0)
    turn.seen("team/p", pods["team/p"], 0.0)
    turn.changed(0.0)
    assert not turn.busy(0.0, pods.get, claims.get)
    turn.seen("team/gone", _unschedulable(_claim_pod()), 0.0)
    turn.changed(1.0)
    assert not turn.busy(1.0, pods.get, claims.get) and turn.unschedulable == {"team/p"}
