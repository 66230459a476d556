"""fgdx-auto's second rule (issue 19): when the workload asks more CPU per GPU than the
cluster's GPU nodes have (CPU pressure >= 1), GPU tasks break FGD's ties by CPU balance; one
rule in core, read alike by the simulator and the extender."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.engine import Engine, PolicyConfig
from elastic_gpu.core.model import Card, MigInstance, MigProfile, Node
from elastic_gpu.core.policies import node_policy
from elastic_gpu.core.policies.node import FgdxAutoPolicy, cpu_imbalance
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.workload import TargetWorkload, TaskShape, cpu_pressure
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
