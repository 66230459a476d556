"""The agent serves a claim's cards to the pod that names it (issue #15), over real gRPC on
unix sockets: the seed README's pod, admitted by the webhook's core (the claim's share added to
its container under the names the agent advertises), bound with an assignment that gives its
container the ElasticGPU's cards and marks it with the top-level `claims` key, gets exactly
those cards at Allocate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.kubelet import KubeletDouble
from egpu_testing.seed import seed_pod
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.matching import candidates
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.claim_plan import PodClaims
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.claims.model import Claim, ClaimRef, ElasticGPU, ElasticGPUPhase

NODE = "n1"
CORE = "elasticgpu.io/gpu-core"
INVENTORY = {"cards": [{"model": "A100", "memoryMiB": 40960, "devices": ["/dev/nvidia0"]},
                       {"model": "A100", "memoryMiB": 40960, "devices": ["/dev/nvidia1"]}],
             "controlDevices": ["/dev/nvidiactl"]}
REQUESTS: dict[str, int | str] = {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
                                  "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}


class Pods:
    """The node's pods as the API has them (the agent's pod source)."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"].get("nodeName") == node
                and p["status"]["phase"] == "Pending"]

    def on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"].get("nodeName") == node]

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.on_node(node)


def elastic_gpu(claim: Claim, card: int) -> ElasticGPU:
    """The ElasticGPU provisioned for `claim`: its share of one card of the node."""
    share = CardShare(card, f"GPU-fake-{NODE}-{card}", 100, 4)
    return ElasticGPU(f"egpu-{claim.uid}", dict(claim.requests), NODE, (share,),
                      ClaimRef.of(claim), "gpushare-egpuclass", phase=ElasticGPUPhase.BOUND)


def bound_claim_pod(name: str, claim: Claim, egpu: ElasticGPU) -> dict[str, Any]:
    """The seed README's pod naming `claim`, as the webhook stores it and the extender binds
    it: the claim's resources in its container, the ElasticGPU's cards in its assignment
    (marked as the claim's by the top-level `claims` key)."""
    pod: dict[str, Any] = yaml.safe_load(seed_pod(name, claim.name))
    pod["metadata"].update(namespace="default", uid=f"uid-{name}",
                           creationTimestamp="2026-01-01T00:00:00Z")
    verdict = admit(pod, ClusterFacts(), mutate=True,
                    claims=PodClaims("default", {claim.name: claim}))
    assert verdict.allowed, verdict.message
    pod = apply_patch(pod, verdict.patch)
    assignment = json.loads(Assignment(NODE, {"test-cuda": egpu.shares}).to_json())
    assignment["claims"] = {"test-cuda": egpu.name}
    pod["metadata"]["annotations"][ann.ASSIGNMENT] = json.dumps(assignment)
    pod["metadata"]["annotations"][ann.ASSIGNED_NODE] = NODE
    pod["spec"]["nodeName"] = NODE
    pod["status"] = {"phase": "Pending"}
    return pod


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletDouble]:
    double = KubeletDouble(plugin_dir)
    double.start()
    yield double
    double.stop()


@pytest.fixture
def agent(plugin_dir: Path, kubelet: KubeletDouble) -> Iterator[tuple[Agent, Pods]]:
    pods = Pods()
    running = Agent(parse_config({"healthCheck": {"enabled": False}}),
                    FakeBackend.from_dict(INVENTORY, NODE), NODE, pods=pods,
                    plugin_dir=plugin_dir)
    running.start()
    yield running, pods
    running.stop()


def test_a_pod_naming_a_claim_gets_exactly_its_elasticgpus_cards(
        agent: tuple[Agent, Pods], kubelet: KubeletDouble) -> None:
    _, pods = agent
    assert kubelet.wait_for(lambda: len(kubelet.devices(CORE)) == 200)
    first = Claim("default", "gpushare-egpuc-1", "u1", "gpushare-egpuclass", REQUESTS)
    second = Claim("default", "gpushare-egpuc-2", "u2", "gpushare-egpuclass", REQUESTS)
    # the ElasticGPUs hold card 1 and card 0; kubelet offers devices of card 0 both times
    pods.pods.append(bound_claim_pod("test-cuda-1", first, elastic_gpu(first, 1)))
    container = pods.pods[0]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {CORE: "10", "elasticgpu.io/gpu-memory": "4"}
    response = kubelet.allocate(CORE, [[f"0-{k}" for k in range(10)]])
    (served,) = response.container_responses
    assert served.envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE}-1"
    assert [d.host_path for d in served.devices] == ["/dev/nvidiactl", "/dev/nvidia1"]

    pods.pods.append(bound_claim_pod("test-cuda-2", second, elastic_gpu(second, 0)))
    response = kubelet.allocate(CORE, [[f"1-{k}" for k in range(10)]])
    (served,) = response.container_responses
    assert served.envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-fake-{NODE}-0"
    assert [d.host_path for d in served.devices] == ["/dev/nvidiactl", "/dev/nvidia0"]


def test_the_claims_key_of_an_assignment_is_read_like_any_assignment() -> None:
    """The agent's reading path (candidates) takes an assignment with the top-level `claims`
    key: the container's cards are the ElasticGPU's, no problem reported."""
    claim = Claim("default", "c", "u", "gpushare-egpuclass", REQUESTS)
    egpu = elastic_gpu(claim, 1)
    found, problems = candidates([bound_claim_pod("p", claim, egpu)], NODE, CORE, 10, set())
    assert problems == []
    assert [(c.pod, c.container, c.shares) for c in found] == [("p", "test-cuda", egpu.shares)]


MIG_INVENTORY = {"cards": [
    {"model": "A100", "memoryMiB": 40960, "devices": ["/dev/nvidia0"], "mig": [
        {"profile": "3g.20gb", "uuid": "MIG-a", "start": 0},
        {"profile": "3g.20gb", "uuid": "MIG-b", "start": 4}]},
    {"model": "A100", "memoryMiB": 40960, "devices": ["/dev/nvidia1"]},
    {"model": "A100", "memoryMiB": 40960, "devices": ["/dev/nvidia2"]}],
    "controlDevices": ["/dev/nvidiactl"]}


@pytest.mark.parametrize(("requests", "resource", "shares", "offered", "visible"), [
    # a whole-card claim (gpu.provisioner) holding card 2; kubelet offers card 1's device
    ({"nvidia.com/gpu": 1}, "nvidia.com/gpu",
     (CardShare(2, "GPU-fake-n1-2", 1000, 40960),), ["GPU-fake-n1-1"], "GPU-fake-n1-2"),
    # a MIG claim (mig.provisioner) holding instance MIG-b; kubelet offers MIG-a
    ({"nvidia.com/mig-3g.20gb": 1}, "nvidia.com/mig-3g.20gb",
     (CardShare(0, "GPU-fake-n1-0", 0, 20480, "3g.20gb", "MIG-b"),), ["MIG-a"], "MIG-b"),
])
def test_whole_card_and_mig_claims_get_their_elasticgpus_devices(
        plugin_dir: Path, kubelet: KubeletDouble, requests: dict[str, int | str],
        resource: str, shares: tuple[CardShare, ...], offered: list[str], visible: str) -> None:
    pods = Pods()
    running = Agent(parse_config({"migStrategy": "mixed", "healthCheck": {"enabled": False}}),
                    FakeBackend.from_dict(MIG_INVENTORY, NODE), NODE, pods=pods,
                    plugin_dir=plugin_dir)
    running.start()
    try:
        assert kubelet.wait_for(lambda: kubelet.registered(resource))
        claim = Claim("default", "c", "u", "cls", requests)
        egpu = ElasticGPU("egpu-u", dict(requests), NODE, shares, ClaimRef.of(claim), "cls",
                          phase=ElasticGPUPhase.BOUND)
        pods.pods.append(bound_claim_pod("p", claim, egpu))
        assert pods.pods[0]["spec"]["containers"][0]["resources"]["limits"] == {
            resource: "1"}
        (served,) = kubelet.allocate(resource, [offered]).container_responses
        assert served.envs["NVIDIA_VISIBLE_DEVICES"] == visible
    finally:
        running.stop()
