"""kube-scheduler's node-level GPU count, `node.elasticgpu.io/gpu-core` (core/nodefit.py): the
webhook puts it on every GPU container, the agent advertises it per node, and it is a lower
bound of what the extender lets pods hold, so kube-scheduler's NodeResourcesFit never refuses
a node the extender would place a pod on, yet sees a node full of GPU (its preemption then
proposes victims: docs/budgets.md, "Preemption (must-show 2)")."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_testing.seed import seed_pod
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import build_plans, logical_cards
from elastic_gpu.agent.snapshot import snapshot
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import MUTATORS, QUOTA_MUTATORS
from elastic_gpu.core.admission.claim_plan import PodClaims
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.mig.profiles import card_slices
from elastic_gpu.core.model import Card, MigInstance
from elastic_gpu.core.nodefit import NODE_CORE, node_capacity, node_core
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.quota import QUOTA_CORE, canonical_resources
from elastic_gpu.core.request import PodRequest, container_request
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.scheduler.schedconfig import MIG_PROFILES

FACTS = ClusterFacts()


def pod(limits: dict[str, str], requests: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": dict(limits)}
    if requests is not None:
        resources["requests"] = dict(requests)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": resources},
                                    {"name": "side", "image": "y",
                                     "resources": {"limits": {"cpu": "1"}}}]}}


def mutated(p: dict[str, Any], claims: PodClaims | None = None) -> dict[str, Any]:
    verdict = admit(p, FACTS, mutate=True, claims=claims)
    assert verdict.allowed, verdict.message
    out: dict[str, Any] = apply_patch(p, verdict.patch)
    # idempotent: the reinvoked webhook changes nothing more
    assert admit(out, FACTS, mutate=True, claims=claims).patch == ()
    return out


def counted(p: dict[str, Any], part: str = "limits") -> str | None:
    value = (p["spec"]["containers"][0]["resources"].get(part) or {}).get(NODE_CORE)
    return None if value is None else str(value)


@pytest.mark.parametrize(("limits", "count"), [
    ({"tencent.com/vcuda-core": "50"}, "50"),
    ({"nano-gpu/gpu-percent": "37"}, "37"),
    ({"elasticgpu.io/gpu-core": "200"}, "200"),
    ({"nvidia.com/gpu": "2"}, "200"),
    ({"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "4"}, "30"),
    ({"elasticgpu.io/gpu-memory": "4096"}, "1"),  # the 1 % it is given for kubelet's Allocate
    ({"nvidia.com/mig-3g.40gb": "1"}, "42"),
    ({"nvidia.com/mig-1g.10gb": "2"}, "28"),
    ({"nvidia.com/mig-7g.80gb": "1"}, "100"),
])
def test_every_gpu_container_gets_its_node_level_count(limits: dict[str, str], count: str) -> None:
    out = mutated(pod(limits, requests=limits))
    assert counted(out) == count
    assert counted(out, "requests") == count  # an extended resource's request equals its limit
    assert out["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "1"}}  # no GPU
    # the extender's and agent's reading of the pod is unchanged by it
    main = out["spec"]["containers"][0]
    assert container_request("main", main["resources"]) == \
        container_request("main", apply_patch(pod(limits, requests=limits), [
            op for op in admit(pod(limits, requests=limits), FACTS, mutate=True).patch
            if NODE_CORE not in op["path"].replace("~1", "/")])["spec"]["containers"][0][
            "resources"])


def test_by_default_and_beside_the_quotas_names() -> None:
    out = mutated(pod({"tencent.com/vcuda-core": "50"}))
    assert counted(out) == "50" and "requests" not in out["spec"]["containers"][0]["resources"]
    verdict = admit(pod({"nvidia.com/mig-1g.10gb": "1"}), FACTS, mutate=True,
                    mutators=QUOTA_MUTATORS)
    limits = apply_patch(pod({"nvidia.com/mig-1g.10gb": "1"}), verdict.patch)[
        "spec"]["containers"][0]["resources"]["limits"]
    # the quota rounds a MIG instance up (never understated), the node count down (never more
    # than the card): seven 1g instances are 105 % of a card to the quota, 98 % to the node
    assert (limits[QUOTA_CORE], limits[NODE_CORE]) == ("15", "14")


def test_the_webhook_owns_the_name() -> None:
    # understated or inflated: replaced
    for written in ("0", "500"):
        out = mutated(pod({"tencent.com/vcuda-core": "50", NODE_CORE: written},
                          requests={"tencent.com/vcuda-core": "50", NODE_CORE: written}))
        assert (counted(out), counted(out, "requests")) == ("50", "50")
    # on a GPU pod's container that holds no GPU: removed
    p = pod({"nvidia.com/gpu": "1"})
    p["spec"]["containers"][1]["resources"] = {"limits": {"cpu": "1", NODE_CORE: "100"}}
    out = mutated(p)
    assert out["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "1"}}
    # the apiserver's spelling of a right value is kept (it stores 1000 as 1k)
    assert admit(pod({"nvidia.com/gpu": "10", NODE_CORE: "1k"}), FACTS, mutate=True).patch == ()
    # a pod asking no GPU and not naming it: untouched
    assert admit(pod({"cpu": "1"}), FACTS, mutate=True).patch == ()


def test_a_container_backed_by_a_claim_counts_nothing() -> None:
    """The ElasticGPU holds the claim's cards whoever consumes it (several pods may): counting
    each consumer would overstate the node, and evicting one frees none of the cards."""
    claim = Claim("default", "gpushare-egpuc-1", "uid-1", "gpushare-egpuclass",
                  {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
                   "tencent.com/vcuda-memory": 4})
    p = yaml.safe_load(seed_pod("test-cuda-1", "gpushare-egpuc-1"))
    p["metadata"]["namespace"] = "default"
    claims = PodClaims("default", {claim.name: claim})
    out = mutated(p, claims)
    resources = out["spec"]["containers"][0]["resources"]
    # the claim's resources, as before, in canonical names; no node-level count
    assert resources == {part: {"elasticgpu.io/gpu-core": "10", "elasticgpu.io/gpu-memory": "1024"}
                         for part in ("limits", "requests")}
    # and one written on it is taken off
    p["spec"]["containers"][0]["resources"] = {"limits": {NODE_CORE: "10"}}
    assert NODE_CORE not in mutated(p, claims)["spec"]["containers"][0]["resources"]["limits"]


def test_mig_instances_of_one_card_never_count_more_than_the_card() -> None:
    for text in MIG_PROFILES:
        profile = MigProfile.parse(text)
        most = card_slices(None, profile) // profile.slices  # the instances one card holds
        request = container_request("c", {"limits": {profile.resource_name: str(most)}})
        assert node_core(request) <= 100, text
    request = container_request("c", {"limits": {"nvidia.com/mig-1g.10gb": "7"}})
    assert node_core(request) == 98
    assert int(canonical_resources(request)[QUOTA_CORE]) == 105  # why the quota's name is not it
    # an A30 has 4 slices: its four 1g instances are the whole card at node level too
    request = container_request("c", {"limits": {"nvidia.com/mig-1g.6gb": "4"}})
    assert node_core(request) == 100


def test_node_capacity_counts_replicas_of_time_sliced_cards() -> None:
    assert node_capacity([1, 1]) == 200
    assert node_capacity([4, 4]) == 800
    assert node_capacity([0, 1]) == 200  # a card serving no replica is still a card
    assert node_capacity([]) == 0


AGENT_CONFIGS = [
    {},
    {"resources": {"gpu": "iluvatar.com/gpu"}, "timeSlicing": {"replicas": 4}},
    {"migStrategy": "mixed"},
]
NAMES = ["nvidia.com/gpu", "iluvatar.com/gpu", "elasticgpu.io/gpu-core",
         "tencent.com/vcuda-core", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb",
         "elasticgpu.io/gpu-memory"]


def _limit(name: str, size: int) -> str:
    if name in ("elasticgpu.io/gpu-core", "tencent.com/vcuda-core"):
        return str(size * 100 if size > 3 else 10 * size + 5)  # whole cards or a share
    if name == "elasticgpu.io/gpu-memory":
        return str(1024 * size)
    return str(1 + size % 2)


@settings(max_examples=60, deadline=None)
@given(config_index=st.integers(0, len(AGENT_CONFIGS) - 1),
       asks=st.lists(st.tuples(st.sampled_from(NAMES), st.integers(1, 6)), min_size=1,
                     max_size=40))
def test_what_the_extender_places_never_counts_more_than_the_node_advertises(
        config_index: int, asks: list[tuple[str, int]]) -> None:
    """The lower-bound rule: fill a node the agent publishes with whatever the engine places
    (shares, whole cards, replicas, MIG instances); the webhook's counts of the placed pods
    never exceed the node's advertised count, so kube-scheduler never refuses a node the
    extender would take."""
    config = parse_config(AGENT_CONFIGS[config_index])
    cards = logical_cards((
        Card(0, "GPU-0", "A100", 81920, mig=(MigInstance(MigProfile(3, 40), "MIG-a", 0),
                                             MigInstance(MigProfile(1, 10), "MIG-b", 4),
                                             MigInstance(MigProfile(1, 10), "MIG-c", 5))),
        Card(1, "GPU-1", "A100", 81920),
        Card(2, "GPU-2", "A100", 81920)), config.splitBoard)
    snap = snapshot("n", tuple(cards), config, tuple(build_plans(cards, config)))
    advertised = int(snap.capacity[NODE_CORE])
    engine = Engine([snap.node])
    total = 0
    for i, (name, size) in enumerate(asks):
        limits = {name: _limit(name, size)}
        out = apply_patch(pod(limits), admit(pod(limits), FACTS, mutate=True,
                                             mutators=MUTATORS).patch)
        request = PodRequest(f"p{i}", "ns", f"u{i}", (container_request(
            "main", out["spec"]["containers"][0]["resources"]),))
        try:
            assignment = engine.place(request)
        except Unschedulable:
            continue
        engine.allocate(f"u{i}", assignment, request)
        total += int(counted(out) or 0)
        assert total <= advertised, (limits, total, advertised)
