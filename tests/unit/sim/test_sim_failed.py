"""`egpu simulate --json` "failed": each failed task counted once, by its first failing check
over the cluster (docs/simulator.md, "Outputs"), and up to 100% arrived apart from the end."""

from __future__ import annotations

import pytest

from elastic_gpu.core.placement import Engine, Unschedulable
from elastic_gpu.sim.replay import failed_check, replay
from elastic_gpu.sim.trace import Task, make_node


def v100_full_cluster() -> Engine:
    # one V100 node, already full, and three T4 nodes with idle cards
    nodes = [make_node("v", 32_000, 65_536, 1, "V100M32")] + [
        make_node(f"t{i}", 32_000, 65_536, 1, "T4") for i in range(3)]
    engine = Engine(nodes)
    first = Task("fill", 1000, 1024, 1, 1000, "V100M32").request()
    engine.allocate(first.key, engine.place(first), first)
    return engine


def test_a_task_whose_model_exists_but_is_full_fails_on_gpu_not_on_model() -> None:
    engine = v100_full_cluster()
    with pytest.raises(Unschedulable) as err:
        engine.place(Task("late", 1000, 1024, 1, 1000, "V100M32").request())
    summary = err.value.summary
    assert summary is not None
    # most nodes rule it out for the model (what a message shows an example of) ...
    assert summary.counts == (("model", 3), ("gpu", 1)) and summary.category == "model"
    # ... but the check it fails is the cards: the V100 node passes the model check
    assert summary.first_failing == "gpu" and failed_check(err.value) == "gpu"


def test_a_model_nobody_has_fails_on_model() -> None:
    engine = v100_full_cluster()
    with pytest.raises(Unschedulable) as err:
        engine.place(Task("a100", 1000, 1024, 1, 1000, "A100").request())
    assert failed_check(err.value) == "model"


def test_cpu_is_the_first_check_only_where_no_node_has_the_cpu() -> None:
    engine = v100_full_cluster()
    with pytest.raises(Unschedulable) as err:
        engine.place(Task("huge", 64_000, 1024, 1, 1000).request())
    assert failed_check(err.value) == "cpu"
    # CPU on some nodes, cards on none of them: the cards are what it fails on
    nodes = [make_node("cpu-poor", 500, 65_536, 2, "T4"), make_node("gpu-poor", 32_000, 65_536, 1, "T4")]
    engine = Engine(nodes)
    fill = Task("fill", 1000, 1024, 1, 1000).request()
    engine.allocate(fill.key, engine.place(fill), fill)
    with pytest.raises(Unschedulable) as err:
        engine.place(Task("t", 1000, 1024, 1, 1000).request())
    assert err.value.summary is not None and err.value.summary.category in {"cpu", "gpu"}
    assert failed_check(err.value) == "gpu"


def test_a_replay_counts_model_full_failures_as_gpu_and_splits_them_at_100_percent() -> None:
    # 4 cards: one V100, three T4. Every task asks for the V100: the first is placed, the others
    # fail on "gpu" (the T4 nodes rule them out on "model", and they are most of the nodes).
    nodes = [make_node("v", 32_000, 65_536, 1, "V100M32")] + [
        make_node(f"t{i}", 32_000, 65_536, 1, "T4") for i in range(3)]
    tasks = [Task(f"v{i}", 1000, 1024, 1, 1000, "V100M32") for i in range(6)]
    result = replay(nodes, tasks, "fgd", seed=1, inflation=0)
    summary = result.summary()
    assert summary["failed"] == {"gpu": 5}
    # arrived reaches 100% of the 4 cards with the 4th task: 3 failures up to there, 2 after
    assert summary["failed_to_100"] == {"gpu": 3}
    assert len(result.placements) == 1
