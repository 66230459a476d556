"""`elasticgpu.io/gpu: N` is written as `elasticgpu.io/gpu-core: 100·N` (issue #26, item 16):
the same request under the name the agents' share plugin advertises, so kubelet calls the
agent's Allocate for it."""

from __future__ import annotations

from typing import Any

from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.facts import ClusterFacts, default_policies
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.request import RequestKind, container_request

NODE_POLICIES, CARD_POLICIES = default_policies()
FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     largest_memory_node="big", node_policies=NODE_POLICIES,
                     card_policies=CARD_POLICIES)


def pod(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": list(containers)}}


def container(name: str, limits: dict[str, Any], requests: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "x", "resources": resources}


def stored(p: dict[str, Any]) -> dict[str, Any]:
    verdict = admit(p, FACTS, mutate=True)
    assert verdict.allowed, verdict.refusals
    patched: dict[str, Any] = apply_patch(p, verdict.patch)
    return patched


def test_whole_cards_are_stored_as_the_shares_they_stand_for_in_limits_and_requests() -> None:
    p = stored(pod(container("main", {"elasticgpu.io/gpu": "2", "cpu": "1"},
                             {"elasticgpu.io/gpu": "2", "cpu": "1"})))
    resources = p["spec"]["containers"][0]["resources"]
    for part in ("limits", "requests"):
        assert "elasticgpu.io/gpu" not in resources[part]
        assert resources[part]["elasticgpu.io/gpu-core"] == "200"
        assert resources[part]["cpu"] == "1"


def test_the_stored_request_is_the_written_one() -> None:
    written = container_request("main", {"limits": {"elasticgpu.io/gpu": 3}})
    p = stored(pod(container("main", {"elasticgpu.io/gpu": 3})))
    after = container_request("main", p["spec"]["containers"][0]["resources"])
    assert (after.kind, after.cards, after.compute_milli) == (
        written.kind, written.cards, written.compute_milli) == (RequestKind.WHOLE, 3, 1000)


def test_only_the_containers_asking_for_it_change_and_reinvocation_adds_nothing() -> None:
    p = stored(pod(container("a", {"nvidia.com/gpu": "1"}),
                   container("b", {"elasticgpu.io/gpu": "1", "elasticgpu.io/gpu-memory": "1024"})))
    a, b = (c["resources"]["limits"] for c in p["spec"]["containers"])
    assert a["nvidia.com/gpu"] == "1" and "elasticgpu.io/gpu-core" not in a
    assert b["elasticgpu.io/gpu-core"] == "100" and b["elasticgpu.io/gpu-memory"] == "1024"
    assert "elasticgpu.io/gpu" not in b
    assert admit(p, FACTS, mutate=True).patch == ()


def test_requests_unreadable_beside_valid_limits_are_left_to_the_apiserver() -> None:
    # limits win in validation; the apiserver refuses requests unequal to limits itself
    p = stored(pod(container("main", {"elasticgpu.io/gpu": "1"}, {"elasticgpu.io/gpu": "x"})))
    resources = p["spec"]["containers"][0]["resources"]
    assert resources["limits"]["elasticgpu.io/gpu-core"] == "100"
    assert resources["requests"] == {"elasticgpu.io/gpu": "x"}


def test_a_tflops_share_is_stored_as_written_not_as_a_memory_only_share() -> None:
    """A TFLOPS share has no percent of compute, but it is no memory-only share: given the
    memory-only share's `gpu-core: 1` it would ask compute twice and be refused (found on
    `egpu sandbox up`: every `elasticgpu.io/gpu-tflops` pod was refused at create)."""
    written = {"elasticgpu.io/gpu-tflops": "100", "elasticgpu.io/gpu-memory": "8192"}
    p = stored(pod(container("main", dict(written), dict(written))))
    resources = p["spec"]["containers"][0]["resources"]
    assert resources["limits"] == written == resources["requests"]
    assert container_request("main", resources).tflops == 100
