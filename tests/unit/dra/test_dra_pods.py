"""core.dra.pods and the budget ledger: GPU time held through this driver's ResourceClaims."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from elastic_gpu.core.annotations import ASSIGNMENT
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.budget.ledger import observe
from elastic_gpu.core.budget.shares import container_shares
from elastic_gpu.core.budget.timestamps import parse_time
from elastic_gpu.core.budget.usage import record_usage
from elastic_gpu.core.dra.devices import DRIVER
from elastic_gpu.core.dra.pods import claim_compute, container_claims, pod_claim_compute


def _claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


def _r(device: str, request: str = "gpu", driver: str = DRIVER, **consumed: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": "n1", "device": device}
    if consumed:
        out["consumedCapacity"] = consumed
    return out


def _pod() -> dict[str, Any]:
    return {"metadata": {"uid": "u1", "namespace": "team"},
            "spec": {"resourceClaims": [{"name": "share", "resourceClaimName": "half"},
                                        {"name": "tpl", "resourceClaimTemplateName": "mig"},
                                        {"name": "unmade", "resourceClaimTemplateName": "x"}],
                     "containers": [
                         {"name": "a", "resources": {"claims": [{"name": "share"}]}},
                         {"name": "b", "resources": {"claims": [{"name": "tpl",
                                                                 "request": "small"}]}},
                         {"name": "c", "resources": {"claims": [{"name": "unmade"}]}},
                         {"name": "cpu"}]},
            "status": {"resourceClaimStatuses": [{"name": "tpl",
                                                  "resourceClaimName": "pod-tpl-x7"}]}}


CLAIMS = {
    "half": _claim(_r("gpu-0", compute="50", memory="4Gi")),
    "pod-tpl-x7": _claim(_r("gpu-1-mig-0-3g-40gb", request="small"),
                         _r("gpu-2", request="big"),
                         _r("nic-0", request="small", driver="net.example.com")),
}


def test_containers_find_their_claims_directly_and_through_templates() -> None:
    assert container_claims(_pod()) == {"a": [("half", None)], "b": [("pod-tpl-x7", "small")]}


def test_a_claim_holds_its_shares_whole_cards_and_mig_slices_of_this_driver_only() -> None:
    assert claim_compute(CLAIMS["half"]) == Fraction(1, 2)
    assert claim_compute(CLAIMS["pod-tpl-x7"]) == Fraction(3, 7) + 1
    assert claim_compute(CLAIMS["pod-tpl-x7"], "small") == Fraction(3, 7)
    assert claim_compute({"status": {}}) == 0
    assert pod_claim_compute(_pod(), CLAIMS) == {"a": Fraction(1, 2), "b": Fraction(3, 7)}
    assert pod_claim_compute(_pod(), {}) == {}


def test_the_budget_ledger_counts_gpu_time_held_through_claims() -> None:
    pod = _pod()
    pod["status"]["containerStatuses"] = [
        {"name": "a", "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}}}]
    assert observe(pod) is None  # without the claims: no GPU container at all
    record = observe(pod, CLAIMS)
    assert record is not None
    assert {n: c.share for n, c in record.containers.items()} == {
        "a": Fraction(1, 2), "b": Fraction(3, 7)}
    start = parse_time("2026-12-01T10:00:00Z", "t")
    # container a ran 600 s at half a card; b never started
    assert record_usage(record, start, start + 600, start + 600) == 300


def test_a_pod_with_an_assignment_adds_its_claims_to_it() -> None:
    given = Assignment("n1", {"a": (CardShare(0, "GPU-0", 250, 1024),)})
    pod = {"metadata": {"uid": "u2", "namespace": "team",
                        "annotations": {ASSIGNMENT: given.to_json()}},
           "spec": {"resourceClaims": [{"name": "share", "resourceClaimName": "half"}],
                    "containers": [{"name": "a", "resources": {"claims": [{"name": "share"}]}}]}}
    assert container_shares(pod, CLAIMS) == {"a": Fraction(3, 4)}
