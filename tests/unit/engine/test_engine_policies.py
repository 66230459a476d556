"""What each node policy prefers, on hand-made states."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import gpu_node, share, whole

from elastic_gpu.core.frag import Fragmentation
from elastic_gpu.core.placement import Engine, PolicyConfig, task_shape
from elastic_gpu.core.policies import NODE_POLICIES, NodeView, ScoreContext, node_policy
from elastic_gpu.core.policies.node import PackingPolicy
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.workload import TargetWorkload, TaskShape


def view(free: tuple[int, ...], cpu_free: int = 32000, tags: dict[str, int] | None = None) -> NodeView:
    return NodeView(0, "n", "T4", 32000, cpu_free, 65536, 65536, free, tags or {})


def ctx(workload: TargetWorkload | None = None) -> ScoreContext:
    return ScoreContext(Fragmentation(workload or TargetWorkload.default()), np.random.default_rng(0))


def half_used_engine(policy: str) -> Engine:
    engine = Engine([gpu_node("a", cards=2), gpu_node("b", cards=2)], PolicyConfig(node_policy=policy))
    engine.allocate("ns/x", engine.assign(share("x", 500), "a"), share("x", 500))
    return engine


@pytest.mark.parametrize("policy", ["binpack", "bestfit", "packing", "clustering", "fgd", "fgdx"])
def test_packing_like_policies_put_a_share_beside_the_existing_one(policy: str) -> None:
    assert half_used_engine(policy).place(share("y", 300)).node == "a"


def test_spread_uses_the_empty_node() -> None:
    assert half_used_engine("spread").place(share("y", 300)).node == "b"


def test_random_policy_uses_every_feasible_node_and_is_seeded() -> None:
    def run(seed: int) -> list[str]:
        engine = Engine([gpu_node(f"n{i}") for i in range(4)], PolicyConfig(node_policy="random"), seed=seed)
        return [engine.place(share(f"p{i}", 100)).node for i in range(40)]

    assert run(3) == run(3)
    assert set(run(3)) == {"n0", "n1", "n2", "n3"}


def test_packing_scores_follow_the_three_cases() -> None:
    policy, c = PackingPolicy(), ctx()
    task = TaskShape(1000, 300, 1)
    idle = policy.score(c, task, view((1000, 1000)))
    free_card_of_used_node = policy.score(c, task, view((0, 1000)))
    shared_card = policy.score(c, task, view((400, 1000)))
    assert idle < free_card_of_used_node < shared_card
    assert policy.score(c, TaskShape(1000, 0, 0), view((1000,))) == 0


def test_clustering_prefers_nodes_running_the_same_task_class() -> None:
    policy, c = node_policy("clustering"), ctx()
    task = TaskShape(1000, 300, 1)
    same = policy.score(c, task, view((500, 1000), tags={"share-gpu": 1}))
    mixed = policy.score(c, task, view((500, 1000), tags={"share-gpu": 1, "1-gpu": 1}))
    idle = policy.score(c, task, view((1000, 1000)))
    other = policy.score(c, task, view((500, 1000), tags={"1-gpu": 1}))
    assert same > mixed > idle > other


def test_fgd_avoids_breaking_a_whole_card_a_frequent_task_needs() -> None:
    # Workload: all tasks want one whole card. Node 1 has a whole free card and a half card;
    # node 2 has two whole free cards. A 500-milli share should take the half card.
    workload = TargetWorkload((TaskShape(1000, 1000, 1),), (1.0,))
    c = ctx(workload)
    fgd = node_policy("fgd")
    task = TaskShape(1000, 500, 1)
    assert fgd.score(c, task, view((1000, 500))) > fgd.score(c, task, view((1000, 1000)))


def test_bestfit_and_dotprod_prefer_the_tighter_node() -> None:
    c = ctx()
    task = TaskShape(4000, 1000, 1)
    for name in ("bestfit", "dotprod"):
        policy = node_policy(name)
        assert policy.score(c, task, view((1000,), cpu_free=8000)) > policy.score(
            c, task, view((1000, 1000, 1000), cpu_free=32000))


def test_task_shape_of_pods() -> None:
    assert task_shape(share("a", 300, cpu=0, mem=2048)) == TaskShape(100, 300, 1, memory_mib=2048)
    assert task_shape(whole("b", 4, cpu=8000)) == TaskShape(8000, 1000, 4, memory_mib=1024)


def test_every_registered_policy_places_on_a_feasible_node() -> None:
    for name in NODE_POLICIES:
        engine = Engine([gpu_node("small", cards=1), gpu_node("big", cards=8)],
                        PolicyConfig(node_policy=name))
        assert engine.place(whole("w", 4)).node == "big"


def test_fgdx_sends_cpu_only_tasks_to_the_node_with_the_least_idle_gpu() -> None:
    from engine_helpers import cpu_only

    def engine_for(policy: str, seed: int) -> Engine:
        engine = Engine([gpu_node("idle", cards=4), gpu_node("busy", cards=4)],
                        PolicyConfig(node_policy=policy), seed=seed)
        busy = whole("w", 3)
        engine.allocate(busy.key, engine.assign(busy, "busy"), busy)
        return engine

    # FGD scores both nodes alike for a CPU-only task, so its tie-break (the seeded rank)
    # decides; fgdx always picks the node with less idle GPU.
    fgd_choices = {engine_for("fgd", seed).place(cpu_only("c", 1000)).node for seed in range(12)}
    assert fgd_choices == {"idle", "busy"}
    for seed in range(12):
        assert engine_for("fgdx", seed).place(cpu_only("c", 1000)).node == "busy"


def test_fgd_card_rule_keeps_whole_cards_for_whole_card_tasks() -> None:
    workload = TargetWorkload((TaskShape(1000, 1000, 1), TaskShape(1000, 400, 1)), (0.5, 0.5))
    engine = Engine([gpu_node("n", cards=2)], PolicyConfig(node_policy="fgd", card_policy="fgd"),
                    workload=workload)
    first = share("a", 500)
    engine.allocate(first.key, engine.assign(first, "n"), first)
    second = engine.place(share("b", 400))
    assert {s.index for s in second.shares()} == {s.index for s in engine.allocation(first.key).shares()}


def test_fgdx_cpufit_packs_cpu_only_tasks_into_the_tightest_cpu_among_gpu_full_nodes() -> None:
    from engine_helpers import cpu_only

    def engine_for(policy: str, seed: int) -> Engine:
        # Both nodes have every card taken, so FGD and fgdx (idle GPU 0 on both) tie; only the
        # free CPU differs.
        engine = Engine([gpu_node("roomy", cards=2, cpu=64000), gpu_node("tight", cards=2, cpu=16000)],
                        PolicyConfig(node_policy=policy), seed=seed)
        for node in ("roomy", "tight"):
            pod = whole(f"w-{node}", 2)
            engine.allocate(pod.key, engine.assign(pod, node), pod)
        return engine

    fgdx_choices = {engine_for("fgdx", seed).place(cpu_only("c", 4000)).node for seed in range(12)}
    assert fgdx_choices == {"roomy", "tight"}
    for seed in range(12):
        assert engine_for("fgdx-cpufit", seed).place(cpu_only("c", 4000)).node == "tight"
    # the large CPU hole is left whole for a task only it can take
    engine = engine_for("fgdx-cpufit", 0)
    small = cpu_only("small", 4000)
    engine.allocate(small.key, engine.assign(small, engine.place(small).node), small)
    assert engine.place(cpu_only("big", 60000)).node == "roomy"


def test_fgdx_cpufit_keeps_fgdx_rule_first_and_leaves_gpu_tasks_alone() -> None:
    c = ctx()
    cpufit, fgdx = node_policy("fgdx-cpufit"), node_policy("fgdx")
    cpu_task = TaskShape(1000, 0, 0)
    # less idle GPU beats less free CPU
    assert cpufit.score(c, cpu_task, view((0, 0), cpu_free=32000)) > cpufit.score(
        c, cpu_task, view((1000, 0), cpu_free=31000))
    # less free CPU wins between nodes with equal idle GPU
    assert cpufit.score(c, cpu_task, view((0, 0), cpu_free=8000)) > cpufit.score(
        c, cpu_task, view((0, 0), cpu_free=32000))
    gpu_task = TaskShape(1000, 500, 1)
    for free, cpu in (((1000, 500), 8000), ((1000, 1000), 32000)):
        assert cpufit.score(c, gpu_task, view(free, cpu)) == fgdx.score(c, gpu_task, view(free, cpu))


def test_fgdx_mem_sends_a_light_share_where_memory_has_run_out() -> None:
    """Node "spent" has an idle card but too little memory for the workload's heavy shapes;
    node "roomy" has the same cards and plenty of memory. fgdx-mem sees that the idle card of
    "spent" is a fragment anyway and puts a low-memory share there; fgdx, blind to memory,
    cannot tell the two apart and follows its tie-break."""
    from engine_helpers import cpu_only

    workload = TargetWorkload((TaskShape(4000, 1000, 1, memory_mib=40_000),
                               TaskShape(2000, 500, 1, memory_mib=2_000)), (0.6, 0.4))

    def engine_for(policy: str, seed: int) -> Engine:
        engine = Engine([gpu_node("spent", cards=2, mem=65536), gpu_node("roomy", cards=2, mem=65536)],
                        PolicyConfig(node_policy=policy), seed=seed, workload=workload)
        for node in ("spent", "roomy"):
            pod = whole(f"w-{node}", 1, mem=8192)
            engine.allocate(pod.key, engine.assign(pod, node), pod)
        hog = cpu_only("hog", 1000, mem=40_000)  # memory only; the GPU state stays equal
        engine.allocate(hog.key, engine.assign(hog, "spent"), hog)
        return engine

    light = share("light", 500, mem=2048)
    fgdx = {engine_for("fgdx", seed).place(light).node for seed in range(12)}
    assert fgdx == {"spent", "roomy"}
    for seed in range(12):
        assert engine_for("fgdx-mem", seed).place(light).node == "spent"


def test_scores_are_cached_once_for_tasks_that_differ_only_in_memory() -> None:
    """Memory-blind policies share one cache entry per shape (the extender sees many memory
    requests); fgdx-mem, whose score reads memory only through thresholds, one entry too
    (`HostThresholds`); clustering (no array form, memory-blind) one per shape."""
    for policy, entries in (("fgd", 1), ("fgdx-mem", 1), ("clustering", 1)):
        engine = Engine([gpu_node("a"), gpu_node("b")], PolicyConfig(node_policy=policy))
        for mem in (1024, 2048):
            engine.place(share(f"s{mem}", 300, mem=mem))
        assert len(engine._scorer.cache) == entries, policy


def test_the_score_cache_keeps_the_recently_used_shapes_within_its_bound() -> None:
    """Pods that each ask their own CPU are each a new shape: the cache drops the least
    recently used entry rather than growing (an entry is a float per node, marked stale on
    every allocation), and a shape asked again stays."""
    from elastic_gpu.core.placement.scoring import SCORE_CACHE_LIMIT

    engine = Engine([gpu_node("a"), gpu_node("b")], PolicyConfig(node_policy="clustering"))
    first = share("first", 300, cpu=1)
    for i in range(SCORE_CACHE_LIMIT + 50):
        engine.place(share(f"s{i}", 300, cpu=2 + i))
        engine.place(first)  # asked again and again: the most recently used
    cache = engine._scorer.cache
    assert len(cache) == SCORE_CACHE_LIMIT
    shapes = {shape.cpu_milli for _, shape in cache}
    assert 1 in shapes  # the shape asked again survived
    assert 2 not in shapes  # the oldest ones went


@pytest.mark.parametrize("policy", ["fgd", "fgdx-auto", "packing"])
def test_cached_scores_follow_every_change_past_the_change_log(
        policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry learns of node changes from a log of changed rows when it is asked again: after
    a few changes (the log's span wrapping around its ring) and after more changes than the log
    holds, its scores equal those of an engine built afresh on the same allocations."""
    from elastic_gpu.core.placement import scoring

    monkeypatch.setattr(scoring, "CHANGE_LOG", 8)
    nodes = [gpu_node(f"n{i}", cards=4) for i in range(12)]
    names = [n.name for n in nodes]
    engine = Engine(nodes, PolicyConfig(node_policy=policy))
    probes = [share("probe-a", 300, cpu=7), share("probe-b", 600, cpu=9), whole("probe-c", 1)]
    rng = np.random.default_rng(5)
    placed: list[str] = []
    pods: dict[str, PodRequest] = {}
    turn = 0
    for step, changes in enumerate((3, 6, 5, 2, 20, 7, 1, 40)):  # 3+6 > 8: wraps; 20, 40 > 8
        for k in range(changes):
            if placed and rng.random() < 0.2:
                engine.release(placed.pop(int(rng.integers(len(placed)))))
                continue
            pod = share(f"p{step}-{k}", int(rng.integers(1, 10)) * 100, cpu=int(rng.integers(1, 4)))
            # the nodes in turn: consecutive changes are of different rows, so a change the
            # catch-up missed is not hidden by a later change of the same row
            turn += 1
            node = names[turn % len(names)]
            if engine.filter(pod, [node]).feasible:
                engine.allocate(pod.key, engine.assign(pod, node), pod)
                placed.append(pod.key)
                pods[pod.key] = pod
        fresh = Engine(nodes, PolicyConfig(node_policy=policy))
        for key in placed:
            held = engine.allocation(key)
            assert held is not None
            fresh.allocate(key, held, pods[key])
        for probe in probes:
            assert engine.scored(probe, names).as_dict() == fresh.scored(probe, names).as_dict(), \
                (policy, step, probe.key)
