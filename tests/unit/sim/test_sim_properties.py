"""Property test: whatever the trace, a replay never exceeds a card, a node's CPU or memory, or
a task's model constraint, for every policy. Checked from the placements and the task list
alone, not from the engine's own accounting."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic_gpu.core.policies import NODE_POLICIES
from elastic_gpu.sim.replay import replay
from elastic_gpu.sim.trace import Task, make_node

node_rows = st.lists(st.tuples(st.sampled_from((4000, 16000, 96000)), st.sampled_from((8192, 65536)),
                               st.sampled_from((1, 2, 4, 8)), st.sampled_from(("T4", "G2"))),
                     min_size=1, max_size=5)


@st.composite
def task_lists(draw: st.DrawFn) -> list[Task]:
    tasks = []
    for i in range(draw(st.integers(1, 40))):
        gpus = draw(st.sampled_from((0, 1, 1, 1, 2, 4, 8)))
        milli = 0 if gpus == 0 else (draw(st.sampled_from((50, 320, 470, 810, 1000))) if gpus == 1 else 1000)
        spec = draw(st.sampled_from(("", "", "T4", "G2|T4", "A100")))
        tasks.append(Task(f"t{i:03d}", draw(st.sampled_from((0, 1000, 6000, 16000))),
                          draw(st.sampled_from((0, 2048, 16384))), gpus, milli, spec if gpus else ""))
    return tasks


@pytest.mark.parametrize("policy", sorted(NODE_POLICIES))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=node_rows, tasks=task_lists(), seed=st.integers(0, 100),
       inflation=st.sampled_from((0.5, 1.0, 1.3)))
def test_replays_never_exceed_capacities(policy: str, rows: list[tuple[int, int, int, str]],
                                         tasks: list[Task], seed: int, inflation: float) -> None:
    nodes = [make_node(f"n{i}", cpu, mem, gpus, model) for i, (cpu, mem, gpus, model) in enumerate(rows)]
    by_name = {n.name: n for n in nodes}
    task_of = {t.name: t for t in tasks}
    result = replay(nodes, tasks, policy, seed=seed, inflation=inflation, keep_placements=True)
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    card: Counter[tuple[str, int]] = Counter()
    for p in result.placements:
        task = task_of[p.task.split("#")[0]]
        node = by_name[p.node]
        cpu[p.node] += task.cpu_milli
        mem[p.node] += task.memory_mib
        assert len(p.cards) == (task.num_gpu if task.gpu_milli else 0)
        assert len({i for i, _ in p.cards}) == len(p.cards)
        if task.gpu_spec and p.cards:
            assert node.cards[0].model in task.gpu_spec.split("|")
        for index, milli in p.cards:
            assert milli == task.gpu_milli
            card[(p.node, index)] += milli
    for (name, index), used in card.items():
        assert 0 <= index < by_name[name].gpu_count and used <= 1000
    for name, used in cpu.items():
        assert used <= by_name[name].cpu_milli and mem[name] <= by_name[name].memory_mib
    assert len(result.placements) + sum(result.failed.values()) == result.tasks
