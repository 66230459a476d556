"""A multi-card share at admission (issue 40): `elasticgpu.io/gpu: N` beside a one-card share
is N shares on N distinct cards. The webhook keeps the count (it is not N whole cards), counts
N x the share in the quota's accounting names and the node-level count, and refuses N larger
than any node's card count with the reason."""

from __future__ import annotations

from typing import Any

from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.facts import ClusterFacts, default_policies
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.admission.rules import AdmissionRule, describe
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import QUOTA_CORE, QUOTA_MEMORY, canonical_resources
from elastic_gpu.core.request import RequestKind, container_request

NODE_POLICIES, CARD_POLICIES = default_policies()
FACTS = ClusterFacts(largest_cards=4, largest_cards_node="n4", largest_card_memory_mib=16384,
                     largest_memory_node="n4", node_policies=NODE_POLICIES,
                     card_policies=CARD_POLICIES)
LIMITS = {"elasticgpu.io/gpu": "2", "elasticgpu.io/gpu-core": "30",
          "elasticgpu.io/gpu-memory": "8192"}


def pod(limits: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": dict(limits),
                                                   "requests": dict(limits)}}]}}


def test_a_multi_share_is_accepted_and_stored_as_written() -> None:
    written = pod(LIMITS)
    verdict = admit(written, FACTS, mutate=True)
    assert verdict.allowed, verdict.refusals
    stored: dict[str, Any] = apply_patch(written, verdict.patch)
    resources = stored["spec"]["containers"][0]["resources"]
    for part in ("limits", "requests"):
        assert resources[part]["elasticgpu.io/gpu"] == "2"  # not rewritten as whole cards
        assert resources[part]["elasticgpu.io/gpu-core"] == "30"
        assert resources[part][NODE_CORE] == "60"  # N x the share, for kube-scheduler
    request = container_request("main", resources)
    assert (request.kind, request.cards, request.compute_milli, request.memory_mib) == (
        RequestKind.SHARE, 2, 300, 8192)


def test_quota_counts_n_times_the_share() -> None:
    request = container_request("main", {"limits": LIMITS})
    assert canonical_resources(request) == {QUOTA_CORE: "60", QUOTA_MEMORY: "16384"}


def test_more_shares_than_the_largest_node_has_cards_is_refused_with_the_reason() -> None:
    verdict = admit(pod({**LIMITS, "elasticgpu.io/gpu": "5"}), FACTS, mutate=True)
    assert not verdict.allowed
    (refusal,) = verdict.refusals
    assert refusal.rule is AdmissionRule.EXCEEDS_LARGEST_NODE
    assert describe(refusal) == (
        "container main: elasticgpu.io/gpu, elasticgpu.io/gpu-core, elasticgpu.io/gpu-memory="
        "5 shares: a share on each of 5 distinct cards of one node; no node could ever hold "
        "it: the largest node, n4, has 4 cards (rule exceeds-largest-node)")


def test_a_claims_refusal_describes_a_share_on_n_cards() -> None:
    from elastic_gpu.core.claims.provisioning import describe_request

    request = container_request("main", {"limits": LIMITS})
    assert describe_request(request) == "a share of each of 2 cards (30% compute, 8192 MiB)"
    one = container_request("main", {"limits": {"elasticgpu.io/gpu-core": "30"}})
    assert describe_request(one) == "a share of one card (30% compute, 0 MiB)"
