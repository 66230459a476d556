"""Issue 41, one quota and one budget across both paths: what a pod's ResourceClaims of our
DeviceClasses count (`core.dra.quota`, `core.dra.podclaims`), the admission rules and mutators
that use them (`core.admission.dra`, `core.quota.quota_resources`, `dra_billing`,
`budget_priority`), the budget keeper's reading (`core.dra.pods`), and the webhook's live
lookup (`webhook.review`, `webhook.draclaims`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from egpu_testing.webhook_answers import answered
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import QUOTA_MUTATORS
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.budget.priority import PriorityDowngrade
from elastic_gpu.core.dra.podclaims import ClaimRef, FoundClaim, PodDraClaims
from elastic_gpu.core.dra.pods import pod_claim_compute
from elastic_gpu.core.dra.quota import Demand, claim_demand
from elastic_gpu.core.quota import QUOTA_CORE, QUOTA_MEMORY
from elastic_gpu.webhook.draclaims import found_claim
from elastic_gpu.webhook.review import Admission
from elastic_gpu.webhook.sources import Lookups

FACTS = ClusterFacts(largest_cards=8, largest_cards_node="n1")


def spec(cls: str = "gpu.elasticgpu.io", **exactly: Any) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls,
                                                                  **exactly}}]}}


WHOLE = spec()
FORTY = spec(capacity={"requests": {"compute": "40", "memory": "4Gi"}})


def test_claim_demand_in_canonical_units() -> None:
    assert claim_demand(WHOLE) == Demand(100, 0)
    assert claim_demand(FORTY) == Demand(40, 4096)
    assert claim_demand(spec(count=3)) == Demand(300, 0)
    assert claim_demand(spec(allocationMode="All"), all_cards=8) == Demand(800, 0)
    assert claim_demand(spec(capacity={"requests": {"compute": "150"}})) == Demand(100, 0)
    mig = spec("mig.gpu.elasticgpu.io", selectors=[{"cel": {"expression":
              'device.attributes["gpu.elasticgpu.io"].profile == "3g.40gb"'}}])
    assert claim_demand(mig) == Demand(43, 40960)
    assert claim_demand(spec("mig.gpu.elasticgpu.io")) == Demand(100, 0)
    assert claim_demand(spec("other.example.com")) == Demand()
    first = {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.elasticgpu.io"},
        {"name": "small", "deviceClassName": "gpu.elasticgpu.io",
         "capacity": {"requests": {"compute": "20", "memory": "1Gi"}}}]}]}}
    assert claim_demand(first) == Demand(100, 1024)


def claim_pod(name: str = "p", entries: Sequence[tuple[str, str, bool]] = (("gpu", "c", False),),
              limits: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda",
                                 "resources": {"claims": [{"name": e} for e, _, _ in entries]}}
    if limits:
        container["resources"]["limits"] = limits
    return {"metadata": {"name": name, "namespace": "team"}, "spec": {
        "resourceClaims": [{"name": e, ("resourceClaimTemplateName" if t else
                                        "resourceClaimName"): n} for e, n, t in entries],
        "containers": [container]}}


def mutated(pod: dict[str, Any], dra: PodDraClaims, **kw: Any) -> dict[str, Any]:
    verdict = admit(pod, FACTS, mutate=True, mutators=QUOTA_MUTATORS, dra=dra, **kw)
    assert verdict.allowed, verdict.message
    out: dict[str, Any] = apply_patch(pod, verdict.patch)
    # reinvocation changes nothing
    again = admit(out, FACTS, mutate=True, mutators=QUOTA_MUTATORS, dra=dra, **kw)
    assert again.patch == ()
    return out


def test_quota_names_from_claims_on_the_pod() -> None:
    out = mutated(claim_pod(), PodDraClaims({"gpu": FoundClaim(WHOLE)}))
    resources = out["spec"]["containers"][0]["resources"]
    assert resources["limits"] == resources["requests"] == {QUOTA_CORE: "100"}
    assert out["metadata"]["annotations"][ann.DRA_BILLED_CLAIMS] == "gpu"
    # the same claims, read once, put the allocator's placement gate on the pod too
    assert out["spec"]["schedulingGates"] == [{"name": ann.DRA_PLACEMENT_GATE}]
    two = claim_pod(entries=[("a", "t", True), ("b", "c", False)])
    out = mutated(two, PodDraClaims({"a": FoundClaim(FORTY), "b": FoundClaim(FORTY)}))
    assert out["spec"]["containers"][0]["resources"]["requests"] == {QUOTA_CORE: "80",
                                                                     QUOTA_MEMORY: "8192"}


def test_a_shared_claim_counts_once_on_its_first_user() -> None:
    used = PodDraClaims({"gpu": FoundClaim(WHOLE, reserved_for=("first",))})
    out = mutated(claim_pod("second"), used)
    assert "limits" not in out["spec"]["containers"][0]["resources"]
    assert out["metadata"]["annotations"][ann.DRA_BILLED_CLAIMS] == ""
    # the first user itself, reinvoked or read again once reserved, still bills it
    out = mutated(claim_pod("first"), used)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {QUOTA_CORE: "100"}
    # a template's claim is always the pod's own
    tpl = PodDraClaims({"gpu": FoundClaim(WHOLE, reserved_for=("x",))})
    out = mutated(claim_pod("second", [("gpu", "t", True)]), tpl)
    assert out["spec"]["containers"][0]["resources"]["limits"] == {QUOTA_CORE: "100"}


def test_a_user_cannot_understate_or_plant_the_billing() -> None:
    pod = claim_pod(limits={QUOTA_CORE: "1"})
    pod["metadata"]["annotations"] = {ann.DRA_BILLED_CLAIMS: ""}
    out = mutated(pod, PodDraClaims({"gpu": FoundClaim(WHOLE)}))
    assert out["spec"]["containers"][0]["resources"]["limits"] == {QUOTA_CORE: "100"}
    assert out["metadata"]["annotations"][ann.DRA_BILLED_CLAIMS] == "gpu"


def test_both_ways_refused_naming_both() -> None:
    verdict = admit(claim_pod(limits={"nvidia.com/gpu": "1"}), FACTS, mutate=True,
                    dra=PodDraClaims({"gpu": FoundClaim(WHOLE)}))
    assert [r.rule.value for r in verdict.refusals] == ["dra-and-device-plugin"]
    assert "ResourceClaim c" in verdict.message and "nvidia.com/gpu" in verdict.message
    # another driver's claim beside a device-plugin GPU is not ours to judge
    assert admit(claim_pod(limits={"nvidia.com/gpu": "1"}), FACTS, mutate=True,
                 dra=PodDraClaims({"gpu": FoundClaim(spec("other.example.com"))})).allowed


def test_a_claim_that_does_not_exist_is_refused() -> None:
    verdict = admit(claim_pod(entries=[("gpu", "gone", True)]), FACTS,
                    dra=PodDraClaims({"gpu": None}))
    assert [r.rule.value for r in verdict.refusals] == ["dra-claim-not-found"]
    assert "ResourceClaimTemplate gone does not exist" in verdict.message


def test_over_budget_claim_pod_gets_the_lower_class() -> None:
    lower = PriorityDowngrade("egpu-over-budget", -10, "Never")
    out = mutated(claim_pod(), PodDraClaims({"gpu": FoundClaim(WHOLE)}), budget=lower)
    assert out["spec"]["priorityClassName"] == "egpu-over-budget"
    assert out["spec"]["priority"] == -10
    # a pod with another driver's claim only is no GPU pod
    other = mutated(claim_pod(), PodDraClaims({"gpu": FoundClaim(spec("x.example.com"))}),
                    budget=lower)
    assert "priorityClassName" not in other["spec"]


def _allocated(compute: str) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": "n", "device": "gpu-0",
         "consumedCapacity": {"compute": compute}}]}}}}


def test_the_budget_bills_a_shared_claim_once() -> None:
    claims = {"c": _allocated("50")}
    first, second = claim_pod("first"), claim_pod("second")
    first["metadata"]["annotations"] = {ann.DRA_BILLED_CLAIMS: "gpu"}
    second["metadata"]["annotations"] = {ann.DRA_BILLED_CLAIMS: ""}
    assert pod_claim_compute(first, claims) == {"main": Fraction(1, 2)}
    assert pod_claim_compute(second, claims) == {}
    # a pod the webhook never saw bills what it uses, as before
    assert pod_claim_compute(claim_pod("third"), claims) == {"main": Fraction(1, 2)}


def test_found_claim_reads_users_and_template_spec() -> None:
    claim = {"spec": WHOLE, "status": {"reservedFor": [
        {"resource": "pods", "name": "a", "uid": "1"}]}}
    assert found_claim(claim, False) == FoundClaim(WHOLE, ("a",))
    assert found_claim({"spec": {"spec": FORTY}}, True) == FoundClaim(FORTY)


def _review(pod: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"version": "v1", "kind": "Pod"},
                                   "resource": {"version": "v1", "resource": "pods"},
                                   "namespace": "team", "operation": "CREATE",
                                   "object": pod}}).encode()


def test_the_webhook_reads_claims_live_and_refuses_when_it_cannot() -> None:
    asked: list[tuple[str, list[ClaimRef]]] = []

    async def fetch(namespace: str, refs: Sequence[ClaimRef]) -> PodDraClaims:
        asked.append((namespace, list(refs)))
        return PodDraClaims({"gpu": FoundClaim(WHOLE)})

    admission = Admission(FACTS, Lookups(fetch_dra=fetch), mutators=QUOTA_MUTATORS)
    _, payload, _ = answered(asyncio.run(admission.review_async(
        _review(claim_pod(limits={"nvidia.com/gpu": "1"})), mutate=True)))
    response = json.loads(payload)["response"]
    assert response["allowed"] is False and "dra-and-device-plugin" in \
        response["status"]["message"]
    assert asked == [("team", [ClaimRef("gpu", "c", False)])]

    async def down(namespace: str, refs: Sequence[ClaimRef]) -> PodDraClaims:
        raise ConnectionError("refused")

    admission = Admission(FACTS, Lookups(fetch_dra=down), mutators=QUOTA_MUTATORS)
    _, payload, verdict = answered(asyncio.run(admission.review_async(_review(claim_pod()),
                                                                      mutate=True)))
    assert verdict == "refused:dra-claim-lookup"
    assert "could not be read" in json.loads(payload)["response"]["status"]["message"]
