"""The extender beside the real kube-scheduler: request styles, policies, bind errors.

kube-scheduler runs with deploy/scheduler/kube-scheduler-config.yaml's extender stanza (its
own schedulerName, pointed at an `egpu scheduler` subprocess); nodes are kwok fake nodes whose
cards are published as GPUDevices by the agent's fake backend.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import create_pods, list_pods, wait_bound, wait_extender_knows
from egpu_testing.workbench import (
    STYLES,
    ExtenderProcess,
    card_use_from_pods,
    extender_kube_scheduler_config,
    overcommitted,
    pod_manifest,
)
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.devcluster.nodes import fake_inventory, register_fake_nodes
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

#: a profile of the extender's schedulerNames that no kube-scheduler runs in these tests
DIRECT = "direct-binds"


@dataclass
class Setup:
    extender: ExtenderProcess
    scheduler_name: str
    client: Any

    def wait_known(self, nodes: list[str], cards: int, timeout_s: float = 30.0) -> None:
        wait_extender_knows(self.extender.url, nodes, cards, timeout_s)

    def post(self, verb: str, body: Any) -> tuple[int, Any]:
        request = urllib.request.Request(f"{self.extender.url}/{verb}",
                                         data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status), json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


def _setup(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path,
           filter_result: str, config: dict[str, Any] | None = None) -> Iterator[Setup]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    client = k8s_cluster.client()
    ensure_crd(k8s_cluster.kube())
    (port,) = free_ports(1)
    # Two profiles call the extender: the test's kube-scheduler, and DIRECT, which no
    # kube-scheduler runs: tests bind those pods themselves, as kube-scheduler would.
    name = unique_name("egpu")
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log",
                               config={"filterResult": filter_result,
                                       "schedulerNames": [name, DIRECT], **(config or {})},
                               scheduler_name=name)
    extender.start()
    # filterResult: best goes with the configuration without prioritizeVerb (deploy/'s -best);
    # auto with deploy/'s own, which keeps it for the pods auto answers with every node
    start_kube_scheduler(extender_kube_scheduler_config(extender.url, name,
                                                        prioritize=filter_result != "best"))
    try:
        yield Setup(extender, name, client)
    finally:
        extender.stop()


@pytest.fixture
def setup(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path
          ) -> Iterator[Setup]:
    yield from _setup(k8s_cluster, start_kube_scheduler, tmp_path, "all")


@pytest.fixture(params=["all", "best", "auto"])
def any_setup(request: pytest.FixtureRequest, k8s_cluster: Any,
              start_kube_scheduler: Callable[..., Any], tmp_path: Path) -> Iterator[Setup]:
    """Every extender configuration: filter + prioritize, one round trip per pod, and the
    default that chooses between them per pod."""
    yield from _setup(k8s_cluster, start_kube_scheduler, tmp_path, request.param)


@pytest.fixture
def best_setup(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path
               ) -> Iterator[Setup]:
    """filterResult: best: kube-scheduler binds exactly the node the engine chose."""
    yield from _setup(k8s_cluster, start_kube_scheduler, tmp_path, "best")


@pytest.fixture
def observed_setup(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path
                   ) -> Iterator[Setup]:
    """filterResult: best, FGD against the workload of the live pods."""
    yield from _setup(k8s_cluster, start_kube_scheduler, tmp_path, "best",
                      {"targetWorkload": "observed", "workloadRefreshPods": 1})



def assignment_of(pod: dict[str, Any]) -> Assignment:
    notes = pod["metadata"]["annotations"]
    assignment = Assignment.from_json(notes[ann.ASSIGNMENT])
    assert notes[ann.ASSIGNED_NODE] == pod["spec"]["nodeName"] == assignment.node
    return assignment


def mig_node(name: str) -> Node:
    cards = tuple(Card(i, f"GPU-{name}-{i}", "A100-SXM4-80GB", 81920, mig=(
        MigInstance(MigProfile.parse("3g.40gb"), f"MIG-{name}-{i}-0", 0),
        MigInstance(MigProfile.parse("3g.40gb"), f"MIG-{name}-{i}-1", 4))) for i in range(2))
    return Node(name, 96_000, 786_432, cards)


def test_every_request_style_gets_the_cards_it_asked_for(
        setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str,
        k8s_cluster: Any) -> None:
    plain = fake_gpu_nodes(1, gpus=8)
    mig_name = unique_name("mig")
    register_fake_nodes(k8s_cluster.kube(), [mig_node(mig_name)])
    try:
        setup.wait_known(plain, 8)
        setup.wait_known([mig_name], 2)
        pods = [pod_manifest(style, k8s_namespace, limits=limits,
                             scheduler_name=setup.scheduler_name)
                for style, limits in STYLES.items()]
        pods.append(pod_manifest("multi", k8s_namespace, scheduler_name=setup.scheduler_name,
                                 containers={"a": {"nano-gpu/gpu-percent": "50"},
                                             "b": {"elasticgpu.io/gpu-core": "200"},
                                             "sidecar": {}}))
        create_pods(setup.client, pods)
        bound = wait_bound(setup.client, k8s_namespace, [p["metadata"]["name"] for p in pods])
        got = {name: assignment_of(pod) for name, pod in bound.items()}

        (share,) = got["canonical"].containers["main"]
        assert (share.milli, share.memory_mib) == (300, 8192)
        (share,) = got["vcuda"].containers["main"]
        assert (share.milli, share.memory_mib) == (400, 16 * 256)
        (share,) = got["nano"].containers["main"]
        assert share.milli == 250
        whole = got["whole"].containers["main"]
        assert len({s.index for s in whole}) == 2 and all(s.milli == 1000 for s in whole)
        (share,) = got["canonical-whole"].containers["main"]
        assert share.milli == 1000
        (share,) = got["mig"].containers["main"]
        assert got["mig"].node == mig_name and share.mig_profile == "3g.40gb"
        assert share.mig_uuid is not None and share.mig_uuid.startswith(f"MIG-{mig_name}")
        multi = got["multi"].containers
        assert set(multi) == {"a", "b"}
        assert multi["a"][0].milli == 500 and len(multi["b"]) == 2
        inventories = [fake_inventory(plain[0], gpus=8), mig_node(mig_name)]
        assert overcommitted(card_use_from_pods(bound.values()), inventories) == []
    finally:
        k8s_cluster.kubectl("delete", "pods", "-n", k8s_namespace, "--all", "--force",
                            "--grace-period=0", "--wait=false", check=False)
        k8s_cluster.kubectl("delete", "node", mig_name, "--wait=false", check=False)


def test_binpack_and_spread_differ_at_both_tiers(
        any_setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    setup = any_setup
    nodes = fake_gpu_nodes(2, gpus=4)
    setup.wait_known(nodes, 4)

    def place(name: str, node_policy: str, card_policy: str) -> Assignment:
        pod = pod_manifest(name, k8s_namespace, limits={"elasticgpu.io/gpu-core": "30"},
                           scheduler_name=setup.scheduler_name, node_policy=node_policy,
                           card_policy=card_policy)
        create_pods(setup.client, [pod])
        return assignment_of(wait_bound(setup.client, k8s_namespace, [name])[name])

    first = place("first", "binpack", "binpack")
    (first_card,) = first.shares()
    packed = place("packed", "binpack", "binpack")
    (packed_card,) = packed.shares()
    # binpack at both tiers: the same node and the same card as the first pod
    assert packed.node == first.node and packed_card.index == first_card.index
    spread_node = place("spread-node", "spread", "binpack")
    # spread at the node tier: the other, empty node
    assert spread_node.node != first.node
    spread_card = place("spread-card", "binpack", "spread")
    (card,) = spread_card.shares()
    # binpack picks the fuller node (60% used); spread at the card tier an empty card there
    assert spread_card.node == first.node and card.index != first_card.index


def test_unschedulable_pod_gets_a_reason_a_person_can_act_on(
        any_setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    setup = any_setup
    nodes = fake_gpu_nodes(1, gpus=2)
    setup.wait_known(nodes, 2)
    pod = pod_manifest("too-big", k8s_namespace, scheduler_name=setup.scheduler_name,
                       limits={"elasticgpu.io/gpu-core": "50",
                               "elasticgpu.io/gpu-memory": str(200 * 1024)})
    # Only this node is a candidate, so its full explanation is the one kube-scheduler shows.
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": nodes[0]}
    create_pods(setup.client, [pod])
    deadline = time.monotonic() + 30
    message = ""
    while time.monotonic() < deadline and "MiB" not in message:
        (current,) = [p for p in list_pods(setup.client, k8s_namespace)
                      if p["metadata"]["name"] == "too-big"]
        conditions = (current.get("status") or {}).get("conditions") or []
        message = " ".join(c.get("message") or "" for c in conditions
                           if c.get("type") == "PodScheduled")
        time.sleep(0.3)
    assert f"0/2 cards have 50% compute and {200 * 1024} MiB free" in message
    assert not current["spec"].get("nodeName")


def test_bind_rejects_unknown_pods_and_nodes_with_a_clear_error(
        setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    nodes = fake_gpu_nodes(1, gpus=1)
    setup.wait_known(nodes, 1)
    status, body = setup.post("bind", {"PodName": "nobody", "PodNamespace": k8s_namespace,
                                       "PodUID": "0000", "Node": nodes[0]})
    assert status == 200 and "does not exist" in body["Error"]
    # A real pending pod (another scheduler's name, so nobody else binds it) on a ghost node.
    pod = pod_manifest("orphan", k8s_namespace, limits={"elasticgpu.io/gpu-core": "10"},
                       scheduler_name="nobody-schedules-this")
    create_pods(setup.client, [pod])
    (created,) = list_pods(setup.client, k8s_namespace)
    uid = created["metadata"]["uid"]
    status, body = setup.post("bind", {"PodName": "orphan", "PodNamespace": k8s_namespace,
                                       "PodUID": uid, "Node": "ghost-node"})
    assert status == 200 and "node ghost-node is unknown" in body["Error"]
    # issue 26, item 11: onto a real node, the pod of a scheduler that never calls the
    # extender is refused, naming its schedulerName and the ones the extender serves
    status, body = setup.post("bind", {"PodName": "orphan", "PodNamespace": k8s_namespace,
                                       "PodUID": uid, "Node": nodes[0]})
    assert status == 200 and "the pod's schedulerName is 'nobody-schedules-this'" in \
        body["Error"] and f"({', '.join(sorted([setup.scheduler_name, DIRECT]))};" in \
        body["Error"], body
    status, body = setup.post("bind", {"PodName": "orphan", "PodNamespace": k8s_namespace,
                                       "PodUID": "another-uid", "Node": nodes[0]})
    assert status == 200 and "re-created" in body["Error"]
    (after,) = list_pods(setup.client, k8s_namespace)
    assert ann.ASSIGNMENT not in (after["metadata"].get("annotations") or {})
    assert not after["spec"].get("nodeName")


def test_a_repeated_bind_is_idempotent_and_a_conflicting_one_refused(
        setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    nodes = fake_gpu_nodes(2, gpus=2)
    setup.wait_known(nodes, 2)
    # No kube-scheduler runs this pod's profile: the test plays kube-scheduler and binds it.
    pod = pod_manifest("twice", k8s_namespace, limits={"elasticgpu.io/gpu-core": "40"},
                       scheduler_name=DIRECT)
    create_pods(setup.client, [pod])
    (created,) = list_pods(setup.client, k8s_namespace)
    args = {"PodName": "twice", "PodNamespace": k8s_namespace,
            "PodUID": created["metadata"]["uid"], "Node": nodes[0]}
    assert setup.post("bind", args) == (200, {"Error": ""})
    first = assignment_of(wait_bound(setup.client, k8s_namespace, ["twice"])["twice"])
    # kube-scheduler retrying after a timeout gets the same answer, nothing is rewritten...
    assert setup.post("bind", args) == (200, {"Error": ""})
    # ...and a bind elsewhere is refused without touching the pod.
    status, body = setup.post("bind", {**args, "Node": nodes[1]})
    assert status == 200 and f"already bound to {nodes[0]}" in body["Error"]
    (after,) = list_pods(setup.client, k8s_namespace)
    assert assignment_of(after) == first and after["spec"]["nodeName"] == nodes[0]


def test_the_deployed_rbac_is_enough_to_schedule(
        k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path,
        fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    """deploy/scheduler/rbac.yaml: the extender with only those rights binds a GPU pod."""
    import base64

    import yaml

    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    repo = Path(__file__).resolve().parents[3]
    client = k8s_cluster.client()
    ensure_crd(k8s_cluster.kube())
    k8s_cluster.kubectl("create", "namespace", "elastic-gpu", check=False)
    k8s_cluster.kubectl("apply", "-f", str(repo / "deploy/scheduler/rbac.yaml"))
    token = k8s_cluster.kubectl("create", "token", "elastic-gpu-scheduler", "-n",
                                "elastic-gpu").stdout.strip()
    admin = yaml.safe_load(k8s_cluster.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    kubeconfig = tmp_path / "sa.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
    assert base64.b64decode(cluster["certificate-authority-data"])  # TLS still verified
    nodes = fake_gpu_nodes(1, gpus=2)
    (port,) = free_ports(1)
    extender = ExtenderProcess(kubeconfig, port, tmp_path / "extender.log")
    extender.start()
    try:
        name = extender.scheduler_name
        start_kube_scheduler(extender_kube_scheduler_config(extender.url, name))
        Setup(extender, name, client).wait_known(nodes, 2)
        create_pods(client, [pod_manifest("rbac", k8s_namespace, scheduler_name=name,
                                          limits={"elasticgpu.io/gpu-core": "50"})])
        pod = wait_bound(client, k8s_namespace, ["rbac"])["rbac"]
        assert assignment_of(pod).node == nodes[0]
    finally:
        extender.stop()


def test_fgd_sees_the_cpu_that_pods_without_gpus_hold(
        best_setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    """A pod without GPUs, bound by kube-scheduler's rules not ours, takes nearly all the CPU of
    one node: no typical GPU task can use that node's cards any more, so FGD puts the next share
    there. Blind to that pod, FGD would keep the other node's part-used card instead (its idle
    cards look usable), which is where the share goes without the extender counting host use."""
    setup = best_setup
    group = unique_name("fgd-cpu")
    nodes = fake_gpu_nodes(2, gpus=2, cpu_milli=8000, labels={"egpu-test-group": group})
    setup.wait_known(nodes, 2)

    def place(name: str, percent: int) -> Assignment:
        pod = pod_manifest(name, k8s_namespace, limits={"elasticgpu.io/gpu-core": str(percent)},
                           scheduler_name=setup.scheduler_name, node_policy="fgd")
        pod["spec"]["nodeSelector"] = {"egpu-test-group": group}
        create_pods(setup.client, [pod])
        return assignment_of(wait_bound(setup.client, k8s_namespace, [name])[name])

    used = place("first", 30).node
    (starved,) = [n for n in nodes if n != used]
    hog = pod_manifest("hog", k8s_namespace, containers={"main": {"cpu": "7500m"}})
    hog["spec"]["nodeName"] = starved
    create_pods(setup.client, [hog])
    deadline = time.monotonic() + 30
    needle = f'elasticgpu_scheduler_node_requested_cpu_cores{{node="{starved}"}} 7.5'
    while True:
        with urllib.request.urlopen(f"{setup.extender.url}/metrics", timeout=5) as response:
            if needle in response.read().decode():
                break
        assert time.monotonic() < deadline, f"the extender never saw {needle}"
        time.sleep(0.2)
    assert place("second", 50).node == starved


def test_fgd_scores_against_the_workload_of_the_live_pods(
        observed_setup: Setup, fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str
        ) -> None:
    """One card per node; a 40% share holds one of them. With the built-in mix FGD would fill
    the 60% hole (`test_the_observed_workload_changes_where_fgd_puts_a_share`); here the live
    pods are mostly 60% shares still waiting (for a node they cannot have), so FGD keeps the
    hole for them and breaks the idle card."""
    setup = observed_setup
    group = unique_name("observed")
    nodes = fake_gpu_nodes(2, gpus=1, labels={"egpu-test-group": group})
    setup.wait_known(nodes, 1)

    def share(name: str, percent: int, group_label: str) -> dict[str, Any]:
        pod = pod_manifest(name, k8s_namespace, limits={"elasticgpu.io/gpu-core": str(percent)},
                           scheduler_name=setup.scheduler_name, node_policy="fgd")
        pod["spec"]["nodeSelector"] = {"egpu-test-group": group_label}
        return pod

    create_pods(setup.client, [share("first", 40, group)])
    holder = assignment_of(wait_bound(setup.client, k8s_namespace, ["first"])["first"]).node
    create_pods(setup.client, [share(f"waiting-{i}", 60, "nowhere") for i in range(30)])
    deadline = time.monotonic() + 30
    while True:  # until the extender has seen them all; it rebuilds at the next filter
        with urllib.request.urlopen(f"{setup.extender.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        live = [line for line in text.splitlines()
                if line.startswith("elasticgpu_scheduler_workload_live_pods ")]
        if live and float(live[0].split()[1]) >= 31:
            break
        assert time.monotonic() < deadline, f"the extender counts {live} live pods"
        time.sleep(0.2)
    create_pods(setup.client, [share("probe", 30, group)])
    probe = assignment_of(wait_bound(setup.client, k8s_namespace, ["probe"])["probe"])
    assert probe.node != holder
