"""The simulator injects multi-card shares (issue 40): the public traces have none."""

from __future__ import annotations

import pytest

from elastic_gpu.core.request import RequestKind
from elastic_gpu.sim.builtin import builtin_nodes, builtin_tasks
from elastic_gpu.sim.replay import replay
from elastic_gpu.sim.trace import Task, with_multi_shares


def test_a_fraction_of_the_share_tasks_ask_their_share_on_n_cards() -> None:
    tasks = builtin_tasks(400)
    shares = [t for t in tasks if t.num_gpu == 1 and 0 < t.gpu_milli < 1000]
    out = with_multi_shares(tasks, 0.3, 3)
    assert [t.name for t in out] == [t.name for t in tasks]  # the same tasks, in order
    changed = [(a, b) for a, b in zip(tasks, out, strict=True) if a != b]
    assert len(changed) == round(0.3 * len(shares))
    for before, after in changed:
        assert (after.num_gpu, after.gpu_milli) == (3, before.gpu_milli)
        (container,) = after.request().containers
        assert (container.kind, container.cards, container.compute_milli) == (
            RequestKind.SHARE, 3, before.gpu_milli)
    assert with_multi_shares(tasks, 0.3, 3) == out  # the same for every seed of a replay
    assert with_multi_shares(tasks, 0.0, 2) == tasks


def test_bad_injections_are_refused() -> None:
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        with_multi_shares([], 1.5, 2)
    with pytest.raises(ValueError, match="2 cards or more"):
        with_multi_shares([], 0.5, 1)


def test_a_replay_places_multi_shares_on_distinct_cards() -> None:
    nodes = builtin_nodes()[:60]
    tasks = with_multi_shares(builtin_tasks(600), 0.5, 2)
    result = replay(nodes, tasks, "fgdx-auto", seed=1, keep_placements=True)
    multi = {t.name for t in tasks if t.num_gpu == 2 and t.gpu_milli < 1000}
    placed = [p for p in result.placements if p.task.split("#")[0] in multi]
    assert placed
    for p in placed:
        assert len({index for index, _ in p.cards}) == 2
        assert all(milli < 1000 for _, milli in p.cards)


def test_whole_card_trace_tasks_stay_whole_cards() -> None:
    (container,) = Task("t", 1000, 1024, 2, 1000).request().containers
    assert (container.kind, container.cards) == (RequestKind.WHOLE, 2)
