"""What the peers' unit tests share: cluster facts, a one-container pod, admission's answer."""

from __future__ import annotations

from typing import Any

from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.facts import ClusterFacts, default_policies
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.request import RequestKind, pod_request_from_manifest

NODE_POLICIES, CARD_POLICIES = default_policies()
FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     largest_memory_node="big", smallest_card_memory_mib=16384,
                     models=frozenset({"A100-SXM4-80GB", "T4"}), node_policies=NODE_POLICIES,
                     card_policies=CARD_POLICIES)


def pod(limits: dict[str, Any], annotations: dict[str, str] | None = None,
        requests: dict[str, Any] | None = None, scheduler: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x",
                                            "resources": resources}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def stored(p: dict[str, Any], facts: ClusterFacts = FACTS) -> dict[str, Any]:
    verdict = admit(p, facts, mutate=True)
    assert verdict.allowed, verdict.message
    out: dict[str, Any] = apply_patch(p, verdict.patch)
    again = admit(out, facts, mutate=True)
    assert again.allowed and again.patch == (), again.patch  # reinvocation adds nothing
    return out


def asked(p: dict[str, Any]) -> tuple[RequestKind, int, int, int]:
    c = pod_request_from_manifest(stored(p)).gpu_containers[0]
    return c.kind, c.cards, c.compute_milli, c.memory_mib


def refusal(p: dict[str, Any], facts: ClusterFacts = FACTS) -> str:
    verdict = admit(p, facts, mutate=True)
    assert not verdict.allowed
    return verdict.message
