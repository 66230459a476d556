"""fgdx-auto's second rule (issue 19): when the workload asks more CPU per GPU than the
cluster's GPU nodes have (CPU pressure >= 1), GPU tasks break FGD's ties by CPU balance; one
rule in core, read alike by the simulator and the extender."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.model import Card, MigInstance, MigProfile, Node, cluster_cpu_per_gpu
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.policies import node_policy
from elastic_gpu.core.policies.node import FgdxAutoPolicy, cpu_imbalance
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.workload import (
    FGD_POPULARITY,
    TargetWorkload,
    TaskShape,
    cpu_pressure,
    share_of_gpu_asked,
    tally_cpu_per_gpu,
)
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state import SchedulerState
from elastic_gpu.sim.replay import target_workload
from elastic_gpu.sim.trace import Task

#: ten GPU tasks of one card and 10 CPUs each: the workload asks 10 CPUs per card
TASKS = [Task(f"t{i}", 10_000, 1024, 1, 1000) for i in range(10)]


def _node(name: str, cpus: int, cards: int = 4) -> Node:
    return Node(name, cpus * 1000, 512_000,
                tuple(Card(i, f"GPU-{name}-{i}", "A100", 40_960) for i in range(cards)))


def _cluster(scarce: bool) -> list[Node]:
    """a (24 CPUs) and b (72 CPUs), four cards each: 12 CPUs per card, pressure 10/12. With
    `scarce`, c too: four cards and 1 CPU, which takes no task but brings the cluster to 97 CPUs
    for 12 cards, pressure 10 / 8.08 = 1.24."""
    nodes = [_node("a", 24), _node("b", 72)]
    return [*nodes, _node("c", 1)] if scarce else nodes


def _probe(name: str = "probe") -> dict[str, Any]:
    return pod_manifest(name, uid=f"uid-{name}",
                        containers={"main": {"elasticgpu.io/gpu-core": "100", "cpu": "10"}})


def test_a_workload_records_the_cpu_it_asks_per_gpu_over_every_task() -> None:
    gpu, cpu_only = TaskShape(8000, 1000, 2), TaskShape(4000, 0, 0)
    tally = {gpu: 3, cpu_only: 1}  # (24 + 4) CPUs for 6 cards
    for popularity in (0.5, 1.0):  # the typical pods may drop shapes; the ratio is the tasks'
        workload = TargetWorkload.from_counts(tally, popularity)
        assert workload.cpu_per_gpu == pytest.approx(28_000 / 6_000)
    # built from shapes and weights, it is read from them; the balance target has GPU shapes only
    direct = TargetWorkload((gpu, cpu_only), (0.5, 0.5))
    assert direct.cpu_per_gpu == pytest.approx(12_000 / 2_000)
    assert direct.gpu_task_cpu_per_gpu == pytest.approx(8_000 / 2_000)
    assert TargetWorkload((cpu_only,), (1.0,)).cpu_per_gpu is None
    assert TargetWorkload((cpu_only,), (1.0,)).gpu_task_cpu_per_gpu is None
    with pytest.raises(ValueError, match="non-negative"):
        TargetWorkload((gpu,), (1.0,), cpu_per_gpu=-1.0)


def test_cpu_pressure_is_the_workloads_cpu_per_gpu_over_the_clusters() -> None:
    assert cpu_pressure(10.0, 8.0) == pytest.approx(1.25)
    assert cpu_pressure(None, 8.0) is None
    assert cpu_pressure(10.0, None) is None
    assert cpu_pressure(10.0, 0.0) is None


def test_the_engine_knows_its_clusters_cpu_per_gpu_and_keeps_it_across_workloads() -> None:
    engine = Engine(_cluster(scarce=False), workload=target_workload(TASKS, "fgdx-auto"))
    engine.filter(pod_request_from_manifest(_probe()))
    assert engine.ctx.cluster_cpu_per_gpu == pytest.approx(96_000 / 8_000)
    assert engine.ctx.cpu_pressure == pytest.approx(10 / 12)
    engine.upsert_node(_node("c", 1))
    engine.filter(pod_request_from_manifest(_probe()))
    assert engine.ctx.cpu_pressure == pytest.approx(10 / (97 / 12))
    engine.set_workload(TargetWorkload((TaskShape(6_000, 1000, 1),), (1.0,)))
    assert engine.ctx.cpu_pressure == pytest.approx(6 / (97 / 12))
    engine.remove_node("c")
    engine.filter(pod_request_from_manifest(_probe()))
    assert engine.ctx.cpu_pressure == pytest.approx(6 / 12)
    # MIG-enabled cards serve no share or whole-card request: their node's CPU is not counted
    carved = (MigInstance(MigProfile(3, 40), "MIG-m-0", 0),)
    mig = Node("m", 64_000, 512_000, (Card(0, "GPU-m-0", "A100", 81_920, mig=carved),))
    assert mig.cards[0].mig_enabled
    engine.upsert_node(mig)
    engine.filter(pod_request_from_manifest(_probe()))
    assert engine.ctx.cluster_cpu_per_gpu == pytest.approx(12.0)


def test_cpu_imbalance_is_zero_when_cpu_and_usable_gpu_run_out_together() -> None:
    assert cpu_imbalance(30_000, 3000, 10.0) == 0.0
    assert cpu_imbalance(14_000, 3000, 10.0) == pytest.approx(16_000 / 128_000)
    assert cpu_imbalance(62_000, 3000, 10.0) == pytest.approx(32_000 / 128_000)
    assert cpu_imbalance(500_000, 0, 10.0) == 1.0  # capped: it only ranks FGD's ties


def test_the_balance_target_is_the_tasks_cpu_per_gpu_capped_at_the_clusters() -> None:
    policy = FgdxAutoPolicy()
    engine = Engine(_cluster(scarce=True), workload=target_workload(TASKS, "fgdx-auto"))
    engine.filter(pod_request_from_manifest(_probe()))
    assert policy.balance_target(engine.ctx) == pytest.approx(97_000 / 12_000)  # 10 wanted
    light = [Task(f"l{i}", 6_000, 1024, 1, 1000) for i in range(9)] + [
        Task("cpu", 40_000, 1024, 0, 0)]  # GPU tasks want 6 per card; with the CPU-only one 10
    engine.set_workload(target_workload(light, "fgdx-auto"))
    assert engine.ctx.cpu_pressure == pytest.approx((94 / 9) / (97 / 12))
    assert policy.balance_target(engine.ctx) == pytest.approx(6_000 / 1_000)


def _scores(scarce: bool, policy: str = "fgdx-auto") -> dict[str, float]:
    engine = Engine(_cluster(scarce), PolicyConfig(node_policy=policy),
                    workload=target_workload(TASKS, policy))
    return engine.score(pod_request_from_manifest(_probe()), ["a", "b", "c"])


def test_under_cpu_pressure_fgd_ties_go_to_the_node_whose_cpu_matches_its_gpu() -> None:
    # FGD ties a and b (the shape still fits both, no fragment either way): 50 each. The tasks
    # want 10 CPUs per card, the cluster has 97 / 12 = 8.08: a node should keep 8.08 per usable
    # card. a keeps 14 CPUs for its 3 free cards (24.25 wanted), b 62: a is the balanced one.
    calm, scarce = _scores(scarce=False), _scores(scarce=True)
    assert calm == {"a": 50.0, "b": 50.0}
    assert _scores(scarce=False, policy="fgdx-mem") == calm  # no pressure: fgdx-mem's scores
    assert set(scarce) == {"a", "b"}  # c has 1 CPU: it cannot take the task
    target = 97 / 12
    assert scarce["a"] == pytest.approx(50 - 1e-3 * abs(14 - 3 * target) / 128)
    assert scarce["b"] == pytest.approx(50 - 1e-3 * abs(62 - 3 * target) / 128)
    assert 50 - scarce["b"] <= 1e-3  # far below one FGD point: it only ranks FGD's ties
    assert _scores(scarce=True, policy="fgdx-mem") == {"a": 50.0, "b": 50.0}


def test_under_cpu_pressure_every_seed_places_on_the_balanced_node() -> None:
    chosen: dict[bool, Counter[str]] = {False: Counter(), True: Counter()}
    for scarce in (False, True):
        for seed in range(12):
            engine = Engine(_cluster(scarce), PolicyConfig(node_policy="fgdx-auto"), seed=seed,
                            workload=target_workload(TASKS, "fgdx-auto"))
            chosen[scarce][engine.place(pod_request_from_manifest(_probe())).node] += 1
    assert chosen[True] == Counter({"a": 12})
    assert set(chosen[False]) == {"a", "b"}  # without pressure the seeded rank decides the tie


def test_cpu_only_tasks_keep_fgdx_rule_under_pressure() -> None:
    engine = Engine(_cluster(scarce=True), PolicyConfig(node_policy="fgdx-auto"),
                    workload=target_workload(TASKS, "fgdx-auto"))
    cpu_only = pod_request_from_manifest(pod_manifest(
        "cpu", containers={"main": {"cpu": "2", "memory": "1Gi"}}))
    engine.filter(cpu_only)
    policy = node_policy("fgdx-auto")
    assert isinstance(policy, FgdxAutoPolicy)
    assert policy.balances_cpu(engine.ctx)
    assert engine.score(cpu_only, ["a", "b", "c"]) == Engine(
        _cluster(scarce=True), PolicyConfig(node_policy="fgdx-mem"),
        workload=target_workload(TASKS, "fgdx-mem")).score(cpu_only, ["a", "b", "c"])


def _extender(scarce: bool) -> SchedulerState:
    config = SchedulerConfig(target_workload="observed")  # the default node policy
    pods = [pod_manifest(f"w{i}", uid=f"uid-w{i}",
                         containers={"main": {"elasticgpu.io/gpu-core": "100", "cpu": "10",
                                              "memory": "1Gi"}})
            for i in range(10)]
    return ready_state(_cluster(scarce), SchedulerState(config), pods=pods)


@pytest.mark.parametrize("scarce", [False, True])
def test_the_extender_sees_the_pressure_the_simulator_sees_and_ranks_alike(scarce: bool) -> None:
    state = _extender(scarce)
    probe = pod_request_from_manifest(_probe())
    # kube-scheduler's own NodeResourcesFit rules c out (1 CPU) before it asks the extender;
    # c still counts in the cluster's CPU per GPU
    feasible = state.filter(probe, "uid-probe", ["a", "b"]).feasible
    assert feasible == ["a", "b"]
    simulator = Engine(_cluster(scarce), workload=target_workload(TASKS, "fgdx-auto"))
    simulator.filter(probe)
    pressure = state.engine.ctx.cpu_pressure
    assert pressure is not None
    assert pressure == pytest.approx(simulator.ctx.cpu_pressure)
    assert (pressure >= 1.0) is scarce
    ranks = state.prioritize(probe, "uid-probe", feasible)
    # a and b tie on FGD: under pressure the balance tie-break ranks a first, else they tie
    assert ranks == ({"a": 10, "b": 0} if scarce else {"a": 10, "b": 10})


def test_the_share_of_gpu_asked_by_shares_and_the_cpu_per_gpu_of_a_tally() -> None:
    share, whole, pair = TaskShape(4000, 500, 1), TaskShape(8000, 1000, 1), TaskShape(0, 1000, 2)
    cpu_only = TaskShape(6000, 0, 0)
    # 3 x 0.5 card by shares, 1 + 2 cards whole: 1.5 of 4.5 cards
    tally = {share: 3, whole: 1, pair: 1, cpu_only: 2}
    assert share_of_gpu_asked(tally) == pytest.approx(1500 / 4500)
    assert tally_cpu_per_gpu(tally) == pytest.approx(32_000 / 4_500)
    assert TargetWorkload.from_counts(tally, 1.0).cpu_per_gpu == tally_cpu_per_gpu(tally)
    assert share_of_gpu_asked({share: 2, whole: 0, cpu_only: 5}) == 1.0  # counts <= 0 ignored
    assert share_of_gpu_asked({cpu_only: 5}) == 0.0
    assert tally_cpu_per_gpu({cpu_only: 5}) is None


def test_the_clusters_cpu_per_gpu_leaves_out_mig_cards_and_cardless_nodes() -> None:
    carved = (MigInstance(MigProfile(3, 40), "MIG-m-0", 0),)
    mig = Node("m", 64_000, 512_000, (Card(0, "GPU-m-0", "A100", 81_920, mig=carved),))
    cpu_node = Node("cpu", 96_000, 512_000)
    assert cluster_cpu_per_gpu([*_cluster(scarce=True), mig, cpu_node]) == pytest.approx(
        97_000 / 12_000)
    assert cluster_cpu_per_gpu([mig, cpu_node]) is None
    assert cluster_cpu_per_gpu([]) is None


def test_under_cpu_pressure_fgdx_auto_takes_fgds_typical_pods_once_shares_ask_most_gpu() -> None:
    policy = FgdxAutoPolicy()
    share, whole = TaskShape(10_000, 600, 1), TaskShape(10_000, 1000, 1)
    share_heavy = {share: 39, whole: 1}   # shares ask 97% of the GPU; 16.4 CPUs per card
    share_light = {share: 1, whole: 39}   # 1.5%; 10.1 CPUs per card
    scarce, roomy = 97_000 / 12_000, 96_000 / 8_000  # the clusters above, per card
    assert policy.popularity_for(share_heavy, scarce) == FGD_POPULARITY
    assert policy.popularity_for(share_heavy, roomy) == FGD_POPULARITY  # 16.4 / 12: pressure
    assert policy.popularity_for(share_light, scarce) == 1.0  # pressure, shares ask little
    assert policy.popularity_for(share_light, roomy) == 1.0   # 10.1 / 12: no pressure
    assert policy.popularity_for(share_heavy, 20.0) == 1.0    # no pressure
    assert policy.popularity_for(share_heavy) == 1.0          # cluster unknown: no pressure
    # the edge: shares asking exactly half switch; pressure exactly 1 switches
    half = {TaskShape(8_000, 500, 1): 2, TaskShape(8_000, 1000, 1): 1}  # 12 CPUs per card
    assert policy.popularity_for(half, 12.0) == FGD_POPULARITY
    assert policy.popularity_for(half, 12.001) == 1.0
    assert node_policy("fgdx-mem").popularity_for(share_heavy, scarce) == 1.0


def _mixed_pods(shares: int, wholes: int, cpus: int) -> tuple[list[dict[str, Any]], list[Task]]:
    """Pending pods on 60% of a card and on a whole card, `cpus` CPUs each, and the same tasks
    as a trace."""
    pods, tasks = [], []
    for name, count, percent in (("s", shares, 60), ("w", wholes, 100)):
        for i in range(count):
            pods.append(pod_manifest(f"{name}{i}", uid=f"uid-{name}{i}", containers={"main": {
                "elasticgpu.io/gpu-core": str(percent), "cpu": str(cpus), "memory": "1Gi"}}))
            tasks.append(Task(f"{name}{i}", cpus * 1000, 1024, 1, percent * 10))
    return pods, tasks


@pytest.mark.parametrize(("shares", "wholes", "cpus", "scarce", "kept"), [
    (39, 1, 10, True, {600}),          # pressure 2.0, shares 97%: FGD's 95%, the whole card dropped
    (39, 1, 10, False, {600}),         # pressure 16.4 / 12 = 1.4 too
    (39, 1, 1, True, {600, 1000}),     # pressure 0.2: every shape
    (1, 39, 10, True, {600, 1000}),    # pressure 1.25, shares 1.5%: every shape
])
def test_the_extender_picks_the_typical_pods_the_simulator_picks(
        shares: int, wholes: int, cpus: int, scarce: bool, kept: set[int]) -> None:
    pods, tasks = _mixed_pods(shares, wholes, cpus)
    nodes = _cluster(scarce)
    state = ready_state(nodes, SchedulerState(SchedulerConfig(target_workload="observed")),
                        pods=pods)
    probe = pod_request_from_manifest(_probe())
    state.filter(probe, "uid-probe", [n.name for n in nodes])
    assert state.workload is not None
    simulated = target_workload(tasks, "fgdx-auto", nodes=nodes)
    assert {s.gpu_milli for s in state.workload.shapes} == kept
    assert {s.gpu_milli for s in simulated.shapes} == kept
    assert state.workload.weights == pytest.approx(simulated.weights)
