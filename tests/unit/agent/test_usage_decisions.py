"""The pure decisions of observed usage (`core.usage`): out-of-band memory, the write rate
limit with its quantisation, drift."""

from __future__ import annotations

from elastic_gpu.core.usage import (
    CardUsage,
    ContainerRef,
    ContainerUsage,
    OverShare,
    ProcessUse,
    WritePolicy,
    Written,
    observe_card,
    over_shares,
    plan_writes,
)

A = ContainerRef("ml", "train", "main")
B = ContainerRef("ml", "serve", "app")
STRANGER = ContainerRef("other", "pod", "c")


def test_holders_processes_are_summed_per_container() -> None:
    usage = observe_card(7000, 60, [ProcessUse(4000, 30, A), ProcessUse(1000, 20, A),
                                    ProcessUse(2000, None, B)], {A, B}, "t")
    assert usage == CardUsage(7000, 0, 60, "t", (
        ContainerUsage("ml", "serve", "app", 2000, None),
        ContainerUsage("ml", "train", "main", 5000, 50)))


def test_out_of_band_is_foreign_processes_plus_memory_beyond_every_process() -> None:
    # A host process (no owner), a pod container that does not hold this card, and 1500 MiB
    # the card reports used that no process lists (a leaked context).
    usage = observe_card(9500, 10, [ProcessUse(4000, 5, A), ProcessUse(2000, None, None),
                                    ProcessUse(2000, None, STRANGER)], {A})
    assert usage.out_of_band_mib == 2000 + 2000 + 1500
    assert usage.used_mib == 9500
    assert [c.container for c in usage.containers] == ["main"]


def test_processes_above_the_cards_figure_raise_used_memory_not_out_of_band() -> None:
    # The card's used memory and the process list are not read at one instant.
    usage = observe_card(3000, 0, [ProcessUse(4000, None, A)], {A})
    assert (usage.used_mib, usage.out_of_band_mib) == (4000, 0)


def test_sm_is_capped_at_the_whole_card() -> None:
    usage = observe_card(0, 120, [ProcessUse(0, 70, A), ProcessUse(0, 70, A)], {A})
    assert usage.sm_percent == 100 and usage.containers[0].sm_percent == 100


POLICY = WritePolicy(period_s=30, out_of_band_threshold_mib=1024, memory_quantum_mib=256,
                     percent_quantum=10, refresh_s=300)


def card(used: int, oob: int = 0, sm: int = 0) -> CardUsage:
    return CardUsage(used, oob, sm)


def test_a_card_never_written_is_written_at_once() -> None:
    plan = plan_writes({0: card(0), 1: card(10)}, {}, None, 0.0, POLICY)
    assert plan.cards == (0, 1) and plan.urgent == (0, 1) and plan.periodic


def test_within_the_period_nothing_is_written_but_an_out_of_band_jump() -> None:
    written = {0: Written(card(1000), 0.0), 1: Written(card(1000), 0.0)}
    sampled = {0: card(8000, sm=90), 1: card(1000)}
    assert plan_writes(sampled, written, 0.0, 10.0, POLICY).cards == ()
    jump = {0: card(8000, sm=90), 1: card(3000, oob=2000)}
    plan = plan_writes(jump, written, 0.0, 10.0, POLICY)
    assert plan.cards == (1,) and not plan.periodic
    # Out-of-band memory going away again is news too.
    back = {0: card(1000), 1: card(1000)}
    later = {0: written[0], 1: Written(card(3000, oob=2000), 10.0)}
    assert plan_writes(back, later, 0.0, 12.0, POLICY).cards == (1,)


def test_after_the_period_only_cards_that_changed_beyond_rounding_are_written() -> None:
    written = {0: Written(card(1000, sm=40), 0.0), 1: Written(card(1000, sm=40), 0.0)}
    sampled = {0: card(1100, sm=41), 1: card(1000 + 600, sm=40)}
    plan = plan_writes(sampled, written, 0.0, 30.0, POLICY)
    assert plan.cards == (1,) and plan.periodic


def test_jitter_around_a_rounding_boundary_is_not_news() -> None:
    # 47 % and 52 % round apart in steps of 5 or 10, but moved less than the step.
    written = {0: Written(card(1000, sm=47), 0.0)}
    assert plan_writes({0: card(1100, sm=52)}, written, 0.0, 30.0, POLICY).cards == ()
    assert plan_writes({0: card(1000, sm=57)}, written, 0.0, 30.0, POLICY).cards == (0,)


def test_an_unchanged_card_is_written_again_after_the_refresh_period() -> None:
    written = {0: Written(card(1000), 0.0)}
    assert plan_writes({0: card(1000)}, written, 270.0, 300.0, POLICY).cards == (0,)
    assert plan_writes({0: card(1000)}, written, 240.0, 299.0, POLICY).cards == ()
    never = WritePolicy(refresh_s=0)
    assert plan_writes({0: card(1000)}, written, None, 10_000.0, never).cards == ()


def test_a_new_holder_is_a_change() -> None:
    written = {0: Written(card(1000), 0.0)}
    holder = CardUsage(1000, 0, 0, containers=(ContainerUsage("a", "b", "c", 1000),))
    assert plan_writes({0: holder}, written, 0.0, 31.0, POLICY).cards == (0,)


def test_a_container_above_its_memory_share_is_over() -> None:
    usage = CardUsage(9000, 0, 0, containers=(ContainerUsage("ml", "train", "main", 6000),
                                              ContainerUsage("ml", "serve", "app", 3000)))
    over = over_shares(2, usage, {A: 4096, B: 4096})
    assert over == [OverShare(A, 2, 6000, 4096)]
    assert over[0].message("GPU-x") == ("container main of ml/train uses 6000 MiB of GPU memory "
                                        "on card 2 (GPU-x); its share is 4096 MiB")


def test_a_compute_only_share_promises_no_memory_and_is_never_over() -> None:
    usage = CardUsage(9000, 0, 0, containers=(ContainerUsage("ml", "train", "main", 6000),))
    assert over_shares(0, usage, {A: 0}) == []
    assert over_shares(0, usage, {}) == []
