"""ResourceQuota in canonical units: the webhook's accounting resources (core.quota)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from egpu_testing.seed import seed_pod
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import QUOTA_MUTATORS
from elastic_gpu.core.admission.claim_plan import PodClaims
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.core.quantity import parse_quantity
from elastic_gpu.core.quota import QUOTA_CORE, QUOTA_MEMORY, quota_resources
from elastic_gpu.core.request import pod_request_from_manifest

FACTS = ClusterFacts()


def pod(limits: dict[str, str], requests: dict[str, str] | None = None,
        name: str = "main") -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": dict(limits)}
    if requests is not None:
        resources["requests"] = dict(requests)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": name, "image": "x", "resources": resources},
                                    {"name": "side", "image": "y",
                                     "resources": {"limits": {"cpu": "1"}}}]}}


def mutated(p: dict[str, Any], claims: PodClaims | None = None) -> dict[str, Any]:
    verdict = admit(p, FACTS, mutate=True, mutators=QUOTA_MUTATORS, claims=claims)
    assert verdict.allowed, verdict.message
    out: dict[str, Any] = apply_patch(p, verdict.patch)
    # idempotent: the reinvoked webhook adds nothing
    again = admit(out, FACTS, mutate=True, mutators=QUOTA_MUTATORS, claims=claims)
    assert [op for op in again.patch if "quota.elasticgpu.io" in op["path"]] == []
    return out


def quota_names(p: dict[str, Any], part: str = "limits") -> dict[str, str]:
    values = p["spec"]["containers"][0]["resources"].get(part) or {}
    return {k: v for k, v in values.items() if k.startswith("quota.")}


@pytest.mark.parametrize(("limits", "canonical"), [
    ({"tencent.com/vcuda-core": "50"}, {QUOTA_CORE: "50"}),
    ({"nano-gpu/gpu-percent": "50"}, {QUOTA_CORE: "50"}),
    ({"elasticgpu.io/gpu-core": "50"}, {QUOTA_CORE: "50"}),
    ({"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "4"},
     {QUOTA_CORE: "30", QUOTA_MEMORY: "1024"}),
    ({"elasticgpu.io/gpu-core": "200"}, {QUOTA_CORE: "200"}),
    ({"nvidia.com/gpu": "2"}, {QUOTA_CORE: "200"}),
    ({"nvidia.com/mig-3g.40gb": "1"}, {QUOTA_CORE: "43", QUOTA_MEMORY: "40960"}),
    ({"nvidia.com/mig-1g.10gb": "2"}, {QUOTA_CORE: "30", QUOTA_MEMORY: "20480"}),
    ({"nvidia.com/mig-7g.80gb": "1"}, {QUOTA_CORE: "100", QUOTA_MEMORY: "81920"}),
])
def test_every_alias_gets_the_canonical_names(limits: dict[str, str],
                                              canonical: dict[str, str]) -> None:
    out = mutated(pod(limits, requests=limits))
    assert quota_names(out) == canonical
    assert quota_names(out, "requests") == canonical  # ResourceQuota counts requests
    assert out["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "1"}}  # no GPU
    # the scheduler's and agent's reading of the pod is unchanged by them
    assert pod_request_from_manifest(out).containers == \
        pod_request_from_manifest(apply_patch(pod(limits, requests=limits), [
            op for op in admit(pod(limits, requests=limits), FACTS, mutate=True).patch])).containers


def test_limits_only_get_limits_and_a_non_gpu_pod_nothing() -> None:
    out = mutated(pod({"tencent.com/vcuda-core": "50"}))
    assert quota_names(out) == {QUOTA_CORE: "50"} and "requests" not in \
        out["spec"]["containers"][0]["resources"]
    p = pod({"cpu": "1"})
    assert admit(p, FACTS, mutate=True, mutators=QUOTA_MUTATORS).patch == ()


def test_a_value_the_user_wrote_is_replaced() -> None:
    out = mutated(pod({"tencent.com/vcuda-core": "50", QUOTA_CORE: "0"}))
    assert quota_names(out) == {QUOTA_CORE: "50"}


def test_a_claim_counts_in_the_same_units() -> None:
    claim = Claim("default", "gpushare-egpuc-1", "uid-1", "gpushare-egpuclass",
                  {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
                   "tencent.com/vcuda-memory": 4})
    p = yaml.safe_load(seed_pod("test-cuda-1", "gpushare-egpuc-1"))
    p["metadata"]["namespace"] = "default"
    out = mutated(p, PodClaims("default", {claim.name: claim}))
    assert quota_names(out) == {QUOTA_CORE: "10", QUOTA_MEMORY: "1024"}


def test_must_show_4_arithmetic_one_card_quota_admits_two_halves_not_three() -> None:
    """What ResourceQuota's admission does with the mutated pods: sum the requests of the
    name (an extended resource's request defaults to its limit) against `hard`."""
    hard, used = 100, 0
    admitted = 0
    for alias in ("tencent.com/vcuda-core", "nano-gpu/gpu-percent", "tencent.com/vcuda-core"):
        out = mutated(pod({alias: "50"}))
        asked = int(parse_quantity(quota_names(out)[QUOTA_CORE]))
        if used + asked > hard:
            break
        used += asked
        admitted += 1
    assert (admitted, used) == (2, 100)


def test_quota_mutator_alone_is_not_in_the_default_list() -> None:
    from elastic_gpu.core.admission.chain import MUTATORS
    assert quota_resources not in MUTATORS and QUOTA_MUTATORS[-1] is quota_resources


def test_a_pod_the_mig_adapter_moves_is_counted_at_its_new_profile() -> None:
    # On by default in the chart and the sandbox (issue #26, item 14): the quota must count
    # what the pod will hold, the profile the MIG adapter's rule gives it, not the one written.
    from elastic_gpu.core.mig.rules import SubstitutionRule
    from elastic_gpu.core.resources import MigProfile

    rule = SubstitutionRule("bare", "team-a", MigProfile.parse("1g.10gb"),
                            MigProfile.parse("2g.20gb"), pod_name="p")
    facts = ClusterFacts(mig_substitutions=(rule,))
    p = pod({"nvidia.com/mig-1g.10gb": "1"})
    out = apply_patch(p, admit(p, facts, mutate=True, mutators=QUOTA_MUTATORS).patch)
    limits = out["spec"]["containers"][0]["resources"]["limits"]
    assert "nvidia.com/mig-2g.20gb" in limits
    assert quota_names(out) == {QUOTA_CORE: "29", QUOTA_MEMORY: "20480"}


def test_a_memory_only_share_counts_the_one_percent_it_holds() -> None:
    out = mutated(pod({"elasticgpu.io/gpu-memory": "4096"}))
    assert quota_names(out) == {QUOTA_CORE: "1", QUOTA_MEMORY: "4096"}
