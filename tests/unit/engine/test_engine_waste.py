"""The expected-waste model and the fgd-waste card tier built on it."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import gpu_node

from elastic_gpu.core.frag import Fragmentation
from elastic_gpu.core.policies import CardView, NodeView, ScoreContext, card_policy
from elastic_gpu.core.waste import ExpectedWaste
from elastic_gpu.core.workload import TargetWorkload, TaskShape


def workload(*sizes: tuple[int, float], models: frozenset[str] = frozenset()) -> TargetWorkload:
    return TargetWorkload(tuple(TaskShape(1000, milli, 1, models) for milli, _ in sizes),
                          tuple(weight for _, weight in sizes))


def test_a_remainder_no_task_fits_is_wasted_whole() -> None:
    waste = ExpectedWaste(workload((500, 1.0)))
    assert waste.of("T4", 300) == 300
    assert waste.of("T4", 0) == 0


def test_persistence_zero_assumes_a_fitting_task_always_comes() -> None:
    # Only 0.47 shares: a fresh card takes two and ends with 60 idle, whatever r it starts from.
    waste = ExpectedWaste(workload((470, 1.0)), persistence=0.0)
    assert waste.of("T4", 1000) == pytest.approx(60)
    assert waste.of("T4", 530) == pytest.approx(60)
    assert waste.added("T4", 530, 470) == pytest.approx(0)


def test_persistence_one_freezes_a_card_when_the_next_task_does_not_fit() -> None:
    waste = ExpectedWaste(workload((500, 0.5), (1000, 0.5)), persistence=1.0)
    # 500 free: half the next tasks fit (then 0 idle), half do not (then 500 idle).
    assert waste.of("T4", 500) == pytest.approx(250)
    # 1000 free: every task fits; a whole card leaves 0, a half leaves the 500 case.
    assert waste.of("T4", 1000) == pytest.approx(0.5 * 250)


def test_the_default_persistence_sits_between_the_two() -> None:
    sizes = ((810, 0.4), (160, 0.05), (470, 0.3), (1000, 0.25))
    low, mid, high = (ExpectedWaste(workload(*sizes), p).of("T4", 190) for p in (0.0, 0.5, 1.0))
    assert low < mid < high
    # A 190 remainder only a rare 0.16 share fits is nearly all waste unless persistence is 0.
    assert low == pytest.approx(30) and mid > 150


def test_tasks_a_model_does_not_accept_are_not_counted_for_it() -> None:
    waste = ExpectedWaste(workload((500, 1.0), models=frozenset({"A100"})), persistence=0.0)
    assert waste.of("A100", 1000) == pytest.approx(0)
    assert waste.of("T4", 1000) == 1000


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="persistence"):
        ExpectedWaste(workload((500, 1.0)), persistence=1.5)
    with pytest.raises(ValueError, match="does not fit"):
        ExpectedWaste(workload((500, 1.0))).added("T4", 300, 500)


def pick(policy: str, free: tuple[int, int], milli: int, target: TargetWorkload) -> int:
    ctx = ScoreContext(Fragmentation(target), np.random.default_rng(0))
    node = gpu_node("n", cards=2)
    view = NodeView(0, "n", "T4", 32000, 30000, 65536, 65536, free)
    cards = CardView(view, TaskShape(1000, milli, 1), node.cards, list(free), [16000, 16000])
    return card_policy(policy).pick_share(ctx, cards, [0, 1], milli, 0)


MIX = workload((650, 0.2), (320, 0.3), (230, 0.2), (470, 0.3))


def test_fgd_waste_breaks_fgd_ties_by_the_waste_added_not_the_card_index() -> None:
    # A 0.32 share, cards with 350 and 320 free: FGD's integer score ties and its rule takes
    # card 0 (30 left over); fgd-waste fills card 1 exactly.
    assert pick("fgd", (350, 320), 320, MIX) == 0
    assert pick("fgd-waste", (350, 320), 320, MIX) == 1
    # 0.23 between 350 and 460 free: 120 left fits nothing of this mix, 230 left fits a 0.23.
    assert pick("fgd", (350, 460), 230, MIX) == 0
    assert pick("fgd-waste", (350, 460), 230, MIX) == 1


def test_fgd_waste_keeps_fgd_order_where_fgd_does_not_tie() -> None:
    # FGD clearly prefers the 470 card for a 0.47 share (0 left, a whole card kept): so does
    # fgd-waste, whatever the waste model says about the other card.
    assert pick("fgd", (1000, 470), 470, MIX) == 1
    assert pick("fgd-waste", (1000, 470), 470, MIX) == 1
