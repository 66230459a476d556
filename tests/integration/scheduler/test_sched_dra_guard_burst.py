"""Issue 41, the ledger stays exact whoever allocates: a burst of claim pods through every
route at once, with the allocator's leader (the extender process) SIGKILLed three times.

On kwok DRA-mode nodes (this driver's slices, stock kube-scheduler): gated share and whole-card
claim pods (our allocator places them), pods whose tenant (a user with `edit`) tries to remove
the gate herself, in every wave, while our allocator writes and while it is down: the policy
`elastic-gpu-dra-gate` refuses her each time (so kube-scheduler never allocates a gated pod's
claims beside ours), and the pods created while no allocator serves wait gated until it is
back; and unchanged `nvidia.com/gpu` pods (the class's `extendedResourceName`,
DRAExtendedResource: kube-scheduler makes and allocates their claims itself, no gate), in the
first waves while ours writes (kube-scheduler's turn: our gates wait for them) and while ours
is down (ours, back, reads those allocations as facts). The
independent check (`egpu_testing.dra_ledger.over_capacity`: every claim's consumed capacity
summed per card from the API's objects, a whole card counting as all of it) finds no card over
capacity among the claims whose pods may run, twice a second all along and at every kill, and
none at all at the end; every pod is bound (none lost), and no pod keeps our gate once the
allocator is back. A card given twice where one holder is the claim of a pod our gate still
holds is the moment docs/dra.md describes (kube-scheduler's allocation landed after ours, late
on a busy box: seen once in a run beside a second suite): nothing runs on the card, and the
allocator must take ours back before it lifts the gate, which the pod's Warning Event shows.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.binding import BY_HAND, binding
from egpu_testing.dra import allocation, claim_manifest, gated_claim_pod, result
from egpu_testing.dra_ledger import dra_inventories, over_capacity
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.tenant import make_tenant
from egpu_testing.waiting import wait_for
from egpu_testing.workbench import (
    ExtenderProcess,
    plain_kube_scheduler_config,
    pod_manifest,
    running_extender,
)
from elastic_gpu.api.admission_policies import DRA_GATE
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.capacity_guard import TAKEN_BACK_REASON
from elastic_gpu.core.dra.classes import EXTENDED_RESOURCE
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.kube.resources import EVENTS, NODES, PODS, RESOURCE_CLAIMS
from elastic_gpu.kube.sync import SyncKubeClient
from elastic_gpu.scheduler.dra_allocator import AllocatorSettings, DraAllocator

pytestmark = pytest.mark.integration

GROUP_LABEL = "test.elasticgpu.io/dra-guard"
HALF = {"compute": "50", "memory": "4Gi"}


@pytest.fixture
def extender(k8s_cluster: ControlPlane, tmp_path: Path) -> Iterator[ExtenderProcess]:
    with running_extender(k8s_cluster, tmp_path, config={"nodePolicy": "binpack"},
                          start_timeout_s=120) as process:
        yield process


class Burst:
    def __init__(self, kube: SyncKubeClient, namespace: str, scheduler: str, group: str,
                 ungate: Callable[[str], None]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.scheduler = scheduler
        self.group = group
        self.ungate = ungate
        self.names: list[str] = []

    def claim_pod(self, name: str, capacity: dict[str, str] | None, *,
                  tenant_ungates: bool = False) -> None:
        """A claim and its pod, gated as the webhook gates it; the tenant may lift the gate."""
        self.kube.create(RESOURCE_CLAIMS.path(self.namespace),
                         claim_manifest(name, self.namespace, capacity=capacity))
        self.kube.create(PODS.path(self.namespace), gated_claim_pod(
            name, self.namespace, self.scheduler, {GROUP_LABEL: self.group}))
        self.names.append(name)
        if tenant_ungates:
            self.ungate(name)

    def extended_pod(self, name: str) -> None:
        """An unchanged nvidia.com/gpu pod: kube-scheduler makes and allocates its claim."""
        pod = pod_manifest(name, self.namespace, scheduler_name=self.scheduler)
        pod["spec"]["containers"][0]["resources"] = {
            "limits": {EXTENDED_RESOURCE: "1"}, "requests": {EXTENDED_RESOURCE: "1"}}
        pod["spec"]["nodeSelector"] = {GROUP_LABEL: self.group}
        self.kube.create(PODS.path(self.namespace), pod)
        self.names.append(name)

    def wave(self, tag: str, halves: int, whole: int, ungated: int, extended: int) -> None:
        for i in range(halves):
            self.claim_pod(f"{tag}-half-{i}", HALF)
        for i in range(whole):
            self.claim_pod(f"{tag}-whole-{i}", None)
        for i in range(ungated):
            self.claim_pod(f"{tag}-tenant-{i}", HALF, tenant_ungates=True)
        for i in range(extended):
            self.extended_pod(f"{tag}-nvidia-{i}")

    def pods(self) -> dict[str, dict[str, Any]]:
        items, _ = self.kube.list(PODS.path(self.namespace))
        return {p["metadata"]["name"]: p for p in items}

    def sample(self) -> tuple[list[str], set[str]]:
        """One reading of the independent check while pods are placed: (every card over
        capacity among the claims whose pods may run, the gated pods whose claims were in a
        card given twice: the allocator's to take back before it lifts their gates). A gated
        pod's claim is named as its pod (`claim_pod`)."""
        pods, claims, inventories = self._reading()
        given_twice = over_capacity(pods, claims, inventories)
        if not given_twice:
            return [], set()
        gated = {p["metadata"]["name"] for p in pods if _gated(p)}
        may_run = [c for c in claims if c["metadata"]["name"] not in gated]
        held = {name for name in gated
                if any(f"claim {self.namespace}/{name}'" in problem for problem in given_twice)}
        return over_capacity(pods, may_run, inventories), held

    def _reading(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Node]]:
        """(the pods, the claims, the group's DRA nodes) as the API has them now."""
        pods = list(self.pods().values())
        claims, _ = self.kube.list(RESOURCE_CLAIMS.path(self.namespace))
        nodes, _ = self.kube.list(NODES.path(), {"labelSelector": f"{GROUP_LABEL}={self.group}"})
        inventories = dra_inventories(nodes)
        assert inventories, "no DRA node of the group"
        return pods, claims, inventories

    def over_capacity(self) -> list[str]:
        return over_capacity(*self._reading())


@pytest.mark.usefixtures("dra_device_classes", "dra_gate_policy")
def test_a_burst_through_every_route_with_three_allocator_kills_leaves_no_card_over_capacity(
        k8s_cluster: ControlPlane, extender: ExtenderProcess,
        fake_gpu_nodes: Callable[..., list[str]],
        start_kube_scheduler: Callable[..., Any]) -> None:
    kube = k8s_cluster.kube()
    namespace = unique_name("guard")
    tenant = make_tenant(Path(k8s_cluster.kubeconfig), namespace)
    group = unique_name("g")
    fake_gpu_nodes(4, gpus=4, labels={GPU_MODE_LABEL: "dra", GROUP_LABEL: group},
                   prefix="dra-guard")
    start_kube_scheduler(plain_kube_scheduler_config(extender.scheduler_name))

    refused: list[str] = []

    def ungate(name: str) -> None:
        """The tenant's own patch (`edit` may change her pods), racing our allocator: refused
        while the gate is on; once our allocator lifted it there is nothing to remove."""
        done = tenant.run("patch", "pod", name, "--type=json",
                          "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]')
        assert done.returncode != 0, f"the tenant removed {name}'s gate"
        if DRA_GATE in done.stderr:
            refused.append(name)
        else:  # the test's JSON patch finds no gates to remove
            assert "schedulingGates" not in kube.get(PODS.path(namespace, name))["spec"], \
                done.stderr

    burst = Burst(kube, namespace, extender.scheduler_name, group, ungate)
    # 16 cards; the waves ask 15 of them (18 halves, all packed by our allocator, the tenant's
    # too; a whole-card claim and five nvidia.com/gpu pods), so every pod fits whatever the
    # order. kube-scheduler allocates the nvidia.com/gpu pods' claims, in waves "a" and "b"
    # while our allocator writes (its turn: our gates wait for them), and while ours is down
    waves = [("a", 2, 1, 1, 1), ("b", 2, 0, 1, 1), ("c", 0, 0, 1, 0), ("d", 1, 0, 1, 0)]
    problems: list[str] = []
    # the independent check all along (each reading one list of the claims), not only at the
    # kills and at the end
    stop, samples = threading.Event(), [0]

    taken_back: set[str] = set()

    def check() -> None:
        found, held = burst.sample()
        problems.extend(found)
        taken_back.update(held)

    def sample() -> None:
        while not stop.wait(0.5):
            check()
            samples[0] += 1
    sampler = threading.Thread(target=sample, name="over-capacity", daemon=True)
    sampler.start()

    def all_bound() -> bool:
        pods = burst.pods()
        return all((pods[n].get("spec") or {}).get("nodeName") for n in burst.names if n in pods)
    try:
        for round_, (tag, halves, whole, ungated, extended) in enumerate(waves):
            burst.wave(tag, halves, whole, ungated, extended)
            if round_ == len(waves) - 1:
                break
            time.sleep(0.5)  # part of the wave placed, part in flight
            extender.kill()  # SIGKILL: nothing written on the way out
            check()
            burst.wave(f"{tag}-down", 1, 0, 2, 1)  # while no allocator serves
            # the tenant's pods wait gated while no allocator serves
            down = burst.pods()
            assert all(_gated(down[f"{tag}-down-tenant-{i}"]) for i in (0, 1))
            extender.start(timeout_s=120)
        wait_for("every pod bound", all_bound, 120)
    finally:
        stop.set()
        sampler.join(30)
    assert samples[0] >= 3
    pods = burst.pods()
    assert sorted(pods) == sorted(burst.names)  # none lost
    assert [n for n, p in pods.items() if _gated(p)] == []
    problems += burst.over_capacity()  # every pod bound: no card given twice at all
    assert problems == []
    # a card seen given twice beside a gated pod's claim: the allocator took that claim back
    # before it lifted the gate, and the pod's Warning Event says so
    wait_for("a taken-back Event on each pod whose claim was in a card given twice", lambda: {
        e["involvedObject"]["name"] for e in kube.list(EVENTS.path(namespace))[0]
        if e["reason"] == TAKEN_BACK_REASON} >= taken_back, 30)
    assert extender.starts == 4
    # the tenant's removals were refused: all of those made while no allocator served, and
    # those that came before our allocator's lift in the live waves
    assert set(refused) >= {f"{tag}-down-tenant-{i}" for tag in "abc" for i in (0, 1)}


@pytest.mark.usefixtures("dra_device_classes")
def test_a_card_given_twice_before_the_gate_lifts_is_taken_back_and_placed_again(
        k8s_cluster: ControlPlane, k8s_namespace: str, fake_gpu_nodes: Callable[..., list[str]],
        start_kube_scheduler: Callable[..., Any]) -> None:
    """The race both allocators can run: kube-scheduler allocates a card's room from a cache
    that has not seen the allocation ours just wrote. Ours lifts the gate only `settle_s` after
    it sees its allocation back and no card it holds is over; here the other allocation lands
    in that window (a long one, in-process), so ours is cleared while its pod is still gated
    (unreserved), placed on the other card, and a Warning Event on the pod says so."""
    kube = k8s_cluster.kube()
    group = unique_name("g")
    (node,) = fake_gpu_nodes(1, gpus=2, labels={GPU_MODE_LABEL: "dra", GROUP_LABEL: group},
                             prefix="dra-twice")
    scheduler = unique_name("s")
    start_kube_scheduler(plain_kube_scheduler_config(scheduler))
    client = SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig))
    allocator = DraAllocator(client.async_client, AllocatorSettings(
        (scheduler,), "binpack", settle_s=3.0))
    running = client.submit(allocator.run())
    try:
        burst = Burst(kube, k8s_namespace, scheduler, group, lambda name: None)
        burst.claim_pod("ours", None)
        claim_path = RESOURCE_CLAIMS.path(k8s_namespace, "ours")

        def ours_device() -> str | None:
            results = _results(kube.get(claim_path))
            return str(results[0]["device"]) if results else None
        first = wait_for("our allocation", ours_device, 60)
        pod = kube.get(PODS.path(k8s_namespace, "ours"))
        assert pod["spec"]["schedulingGates"] == [{"name": DRA_PLACEMENT_GATE}]
        # kube-scheduler's allocation of the same card for another pod, inside the window
        kube.create(RESOURCE_CLAIMS.path(k8s_namespace), claim_manifest("theirs", k8s_namespace))
        theirs_pod = kube.create(PODS.path(k8s_namespace), {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "theirs"},
            "spec": {"nodeName": node, "resourceClaims": [
                {"name": "gpu", "resourceClaimName": "theirs"}],
                "containers": [{"name": "main", "image": "registry.example/cuda:12",
                                "resources": {"claims": [{"name": "gpu"}]}}]}})
        theirs = kube.get(RESOURCE_CLAIMS.path(k8s_namespace, "theirs"))
        theirs["status"] = {"allocation": allocation(node, [result(node, first)]),
                            "reservedFor": [{"resource": "pods", "name": "theirs",
                                             "uid": theirs_pod["metadata"]["uid"]}]}
        kube.update(RESOURCE_CLAIMS.path(k8s_namespace, "theirs", "status"), theirs)
        # the burst test's sampled check, inside the window: the card is given twice, but one
        # holder is our gated pod's claim (the allocator's to take back), so nothing runs over
        # it (unless the allocator was quicker than this reading: then nothing is over at all)
        found, held = burst.sample()
        assert found == [] and held <= {"ours"}
        wait_for("our pod bound", lambda: _bound_to(kube, k8s_namespace, "ours"), 90)
        assert ours_device() not in (None, first)
        assert allocator.cleared_count == 1
        assert burst.over_capacity() == [] and burst.sample() == ([], set())
        # and the pod says so: a Warning Event naming the claim taken back and why
        (event,) = wait_for("the taken-back Event", lambda: [
            e for e in kube.list(EVENTS.path(k8s_namespace))[0]
            if e["involvedObject"]["name"] == "ours" and e["reason"] == TAKEN_BACK_REASON], 30)
        assert event["type"] == "Warning"
        assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]
        assert event["message"].startswith("allocation of claim ours taken back before the "
                                           "pod's gate was lifted: a card was given twice: ")
        assert (f"device {first} of node {node} would hold compute 200 % of 100 %"
                in event["message"])
        assert f"claims allocated on the node ({k8s_namespace}/theirs: 100 %" in event["message"]
    finally:
        running.cancel()
        client.close()


@pytest.mark.usefixtures("dra_device_classes")
def test_no_gate_is_lifted_while_kube_scheduler_may_be_allocating_a_card(
        k8s_cluster: ControlPlane, k8s_namespace: str, fake_gpu_nodes: Callable[..., list[str]],
        start_kube_scheduler: Callable[..., Any]) -> None:
    """kube-scheduler's turn (`core.dra.turn`): an `nvidia.com/gpu` pod is ungated and
    kube-scheduler allocates its claim in the binding cycle, from a cache that may not have seen
    ours. While such a pod waits unbound (here for a scheduler that does not run, so as long as
    the test likes), our allocator, its allocation seen back, keeps the gate; kube-scheduler's
    allocation then lands on the same card long after `settle_s`, the pod is bound, and ours,
    checking only now, takes its claim back and places it on the other card."""
    kube = k8s_cluster.kube()
    group = unique_name("g")
    (node,) = fake_gpu_nodes(1, gpus=2, labels={GPU_MODE_LABEL: "dra", GROUP_LABEL: group},
                             prefix="dra-turn")
    scheduler = unique_name("s")
    start_kube_scheduler(plain_kube_scheduler_config(scheduler))
    client = SyncKubeClient.from_config(Path(k8s_cluster.kubeconfig))
    allocator = DraAllocator(client.async_client, AllocatorSettings(
        (scheduler,), "binpack", settle_s=0.2, turn_s=60.0))
    running = client.submit(allocator.run())
    try:
        burst = Burst(kube, k8s_namespace, BY_HAND, group, lambda name: None)
        burst.extended_pod("theirs")  # in kube-scheduler's hands: ungated, unbound, no claim
        burst.scheduler = scheduler
        burst.claim_pod("ours", None)
        claim_path = RESOURCE_CLAIMS.path(k8s_namespace, "ours")
        first = wait_for("our allocation", lambda: (_results(kube.get(claim_path)) or [{}])[0]
                         .get("device"), 60)
        time.sleep(2.0)  # ten times settle_s: the gate stays while theirs may be allocated
        assert _gated(kube.get(PODS.path(k8s_namespace, "ours")))
        # kube-scheduler's binding cycle for theirs: its claim allocated (our card), then bound
        theirs = kube.create(RESOURCE_CLAIMS.path(k8s_namespace), {
            **claim_manifest("theirs-extended-resources-x", k8s_namespace)})
        theirs["status"] = {"allocation": allocation(node, [result(node, first)])}
        kube.update(RESOURCE_CLAIMS.path(k8s_namespace, "theirs-extended-resources-x",
                                         "status"), theirs)
        k8s_cluster.kubectl("create", "-f", "-",
                            input=json.dumps(binding("theirs", k8s_namespace, node)))
        wait_for("our pod bound", lambda: _bound_to(kube, k8s_namespace, "ours"), 90)
        assert _results(kube.get(claim_path))[0]["device"] != first
        assert allocator.cleared_count == 1
        assert burst.over_capacity() == []
    finally:
        running.cancel()
        client.close()


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == DRA_PLACEMENT_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {})
                .get("results") or [])


def _bound_to(kube: SyncKubeClient, namespace: str, name: str) -> str | None:
    return (kube.get(PODS.path(namespace, name)).get("spec") or {}).get("nodeName")
