"""core.mig.apply: the placement rules against NVIDIA's start slots, and the step function
(fence first, held instances never touched, a killed applier resumes from the real layout)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.mig.apply import (
    FENCE_SETTLE_S,
    Blocked,
    Create,
    Destroy,
    Done,
    Fence,
    FenceCard,
    Holders,
    PendingReset,
    Placed,
    Refuse,
    SetMigMode,
    Settle,
    Unfence,
    holders_of,
    next_step,
    placed_of,
    placement_problems,
)
from elastic_gpu.core.mig.profiles import MIG_MODELS, mig_model
from elastic_gpu.core.model import MigInstance, MigMode
from elastic_gpu.core.resources import MigProfile

A100 = "NVIDIA A100-SXM4-80GB"


def p(name: str, start: int) -> Placed:
    return Placed(start, MigProfile.parse(name))


def inst(name: str, start: int, uuid: str) -> MigInstance:
    return MigInstance(MigProfile.parse(name), uuid, start)


#: NVIDIA's MIG user guide, A100-80GB / H100-80GB placements ("start" in memory slices)
GUIDE_STARTS = {"1g.10gb": [0, 1, 2, 3, 4, 5, 6], "1g.10gb+me": [0, 1, 2, 3, 4, 5, 6],
                "1g.20gb": [0, 2, 4, 6], "2g.20gb": [0, 2, 4], "3g.40gb": [0, 4],
                "4g.40gb": [0], "7g.80gb": [0]}


def test_start_slots_are_the_guides() -> None:
    for name, starts in GUIDE_STARTS.items():
        allowed = [s for s in range(8) if not placement_problems(A100, [p(name, s)])]
        assert allowed == starts, name


def test_a30_start_slots() -> None:
    a30 = {"1g.6gb": [0, 1, 2, 3], "2g.12gb": [0, 2], "4g.24gb": [0]}
    for name, starts in a30.items():
        assert [s for s in range(4) if not placement_problems("A30", [p(name, s)])] == starts


def test_bad_layouts_are_refused_with_the_reason() -> None:
    assert "2g.20gb@2: overlaps" in placement_problems(A100, [p("3g.40gb", 0), p("2g.20gb", 2)])[0]
    assert "may start only at slot 0, 4" in placement_problems(A100, [p("3g.40gb", 2)])[0]
    assert "not a MIG profile of A100-80GB" in placement_problems(A100, [p("1g.5gb", 0)])[0]
    assert "not a MIG model" in placement_problems("NVIDIA T4", [p("1g.10gb", 0)])[0]
    two_me = [p("1g.10gb+me", 0), p("1g.10gb+me", 1)]
    assert "holds at most 1 1g.10gb+me" in placement_problems(A100, two_me)[0]
    full = [p("1g.10gb", s) for s in range(7)]
    assert placement_problems(A100, full) == []
    step = next_step(A100, [p("3g.40gb", 2)], (), Holders(), Fence(), 0.0)
    assert isinstance(step, Refuse) and "3g.40gb@2" in step.reason


def test_fence_first_then_settle_then_carve() -> None:
    wanted = [p("3g.40gb", 0), p("1g.10gb", 4)]
    assert next_step(A100, wanted, (), Holders(), Fence(), 100.0) == FenceCard()
    step = next_step(A100, wanted, (), Holders(), Fence(since=100.0), 101.0)
    assert isinstance(step, Settle) and step.wait_s == FENCE_SETTLE_S - 1
    assert next_step(A100, wanted, (), Holders(), Fence(since=100.0), 106.0) == \
        Create(p("3g.40gb", 0))
    real = (inst("3g.40gb", 0, "MIG-a"), inst("1g.10gb", 4, "MIG-b"))
    assert next_step(A100, wanted, real, Holders(), Fence(since=100.0), 107.0) == Unfence()
    assert next_step(A100, wanted, real, Holders(), Fence(), 108.0) == Done()


def test_mig_mode_goes_off_after_the_last_instance_and_on_before_the_first() -> None:
    real = (inst("3g.40gb", 0, "MIG-a"),)
    fenced = Fence(since=0.0)
    on, off = MigMode(True, True), MigMode(False, False)
    assert next_step(A100, [], real, Holders(), fenced, 60.0, on) == Destroy(real[0])
    assert next_step(A100, [], (), Holders(), fenced, 60.0, on) == SetMigMode(False)
    assert next_step(A100, [], (), Holders(), fenced, 60.0, MigMode(True, False)) == \
        PendingReset("MIG mode off is pending a GPU reset; the operator resets the GPU "
                     "(nvidia-smi -r) when idle")
    assert next_step(A100, [], (), Holders(), fenced, 60.0, off) == Unfence()
    assert next_step(A100, [], (), Holders(), Fence(), 60.0, off) == Done()
    # a card in MIG mode with no instance is not the whole card: it is fenced and switched
    assert next_step(A100, [], (), Holders(), Fence(), 60.0, on) == FenceCard()
    wanted = [p("3g.40gb", 4)]
    assert next_step(A100, wanted, (), Holders(), fenced, 60.0, off) == SetMigMode(True)
    step = next_step(A100, wanted, (), Holders(), fenced, 60.0, MigMode(False, True))
    assert isinstance(step, PendingReset) and step.reason.startswith("MIG mode on is pending")
    assert next_step(A100, wanted, (), Holders(), fenced, 60.0, on) == Create(wanted[0])
    # a change pending that is no longer wanted is taken back
    assert next_step(A100, [], (), Holders(), fenced, 60.0, MigMode(False, True)) == \
        SetMigMode(False)


def test_destroys_come_before_creates() -> None:
    real = (inst("7g.80gb", 0, "MIG-full"),)
    step = next_step(A100, [p("3g.40gb", 0)], real, Holders(), Fence(since=0.0), 60.0)
    assert step == Destroy(real[0])


def test_a_held_card_or_dropped_held_instance_blocks_and_a_kept_one_does_not() -> None:
    real = (inst("3g.40gb", 0, "MIG-a"),)
    whole = Holders(card=("default/trainer",))
    step = next_step(A100, [p("3g.40gb", 4)], (), whole, Fence(), 0.0)
    assert isinstance(step, Blocked) and "default/trainer" in step.reason
    held = Holders(instances=(("MIG-a", "default/infer"),))
    step = next_step(A100, [p("3g.40gb", 4)], real, held, Fence(), 0.0)
    assert isinstance(step, Blocked) and "MIG-a" in step.reason and "default/infer" in step.reason
    # fenced and blocked: the fence goes, so the card is not lost to placement meanwhile
    step = next_step(A100, [p("3g.40gb", 4)], real, held, Fence(since=0.0), 60.0)
    assert isinstance(step, Unfence) and "default/infer" in step.reason
    # the held instance is kept: the free slices beside it are carved
    kept = [p("3g.40gb", 0), p("1g.10gb", 4)]
    assert next_step(A100, kept, real, held, Fence(since=0.0), 60.0) == Create(p("1g.10gb", 4))


def test_holders_from_the_ledger_card_and_instances_apart() -> None:
    whole = Assignment("n1", {"main": (CardShare(0, "GPU-a", 1000, 81920),)})
    mig = Assignment("n1", {"main": (CardShare(1, "GPU-b", 428, 40192, "3g.40gb", "MIG-b1"),)})
    share = Assignment("n1", {"a": (CardShare(1, "GPU-b", 300, 0),),
                              "b": (CardShare(0, "GPU-a", 100, 0),)})
    held = [("ns/whole", whole), ("ns/mig", mig), ("elasticgpu:e1", share)]
    assert holders_of("GPU-a", held) == Holders(card=("elasticgpu:e1", "ns/whole"))
    assert holders_of("GPU-b", held) == Holders(card=("elasticgpu:e1",),
                                                instances=(("MIG-b1", "ns/mig"),))
    assert holders_of("GPU-c", held) == Holders()


def _layouts(model_name: str) -> st.SearchStrategy[list[Placed]]:
    model = mig_model(model_name)
    assert model is not None
    placements = [Placed(s, row.profile) for row in model.profiles
                  for s in range(model.memory_slices)
                  if not placement_problems(model.name, [Placed(s, row.profile)])]

    def pack(order: list[int]) -> list[Placed]:
        out: list[Placed] = []
        for i in order:
            if not placement_problems(model.name, [*out, placements[i]]):
                out.append(placements[i])
        return out
    return st.lists(st.integers(0, len(placements) - 1), max_size=10).map(pack)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), model=st.sampled_from([m.name for m in MIG_MODELS]))
def test_a_killed_applier_reaches_the_wanted_layout_never_touching_held_instances(
        data: st.DataObject, model: str) -> None:
    """Apply step by step; at any step the applier may be killed and restarted (it keeps
    nothing: each step is decided from the card's real layout and fence alone). Whatever the
    start, it ends with exactly the wanted layout, created instances never overlap a live
    one, and a held instance is never destroyed."""
    start = data.draw(_layouts(model))
    real = [MigInstance(x.profile, f"MIG-{i}", x.start) for i, x in enumerate(start)]
    held_uuids = data.draw(st.sets(st.sampled_from([m.uuid for m in real]))) if real else set()
    held = [m for m in real if m.uuid in held_uuids]
    wanted = [*placed_of(held), *(x for x in data.draw(_layouts(model))
                                  if not placement_problems(model, [*placed_of(held), x]))]
    holders = Holders(instances=tuple((u, "ns/pod") for u in sorted(held_uuids)))
    fence, now, serial = Fence(), 0.0, 0
    # the card's MIG mode as NVML reads it (None: a backend without one, the fake's); a card
    # that needs a GPU reset keeps a change pending until the operator's reset
    on = bool(real) or data.draw(st.booleans(), label="mode on")
    mode = data.draw(st.sampled_from([None, MigMode(on, on)]), label="mode")
    reset_needed = data.draw(st.booleans(), label="reset needed")
    for _ in range(60):
        if data.draw(st.booleans(), label="killed"):
            pass  # a restart: nothing is carried over but the card and its fence
        step = next_step(model, wanted, real, holders, fence, now, mode)
        now += 1.0
        if isinstance(step, Done):
            break
        assert not isinstance(step, Refuse | Blocked), step
        if isinstance(step, FenceCard):
            fence = Fence(since=now)
        elif isinstance(step, Settle):
            now += step.wait_s
        elif isinstance(step, Unfence):
            fence = Fence()
        elif isinstance(step, Destroy):
            assert step.instance.uuid not in held_uuids
            real.remove(step.instance)
        elif isinstance(step, SetMigMode):
            assert fence.up and mode is not None and not (real and not step.on)
            mode = MigMode(mode.current if reset_needed else step.on, step.on)
        elif isinstance(step, PendingReset):
            assert fence.up and mode is not None and mode.waits_for_reset
            mode = MigMode(mode.pending, mode.pending)  # the operator resets the GPU
        elif isinstance(step, Create):
            assert fence.up and (mode is None or mode.current)
            assert not placement_problems(model, [*placed_of(real), step.placed])
            serial += 1
            real.append(MigInstance(step.placed.profile, f"MIG-new-{serial}", step.placed.start))
    assert placed_of(real) == sorted(wanted) and not fence.up
    assert all(m in real for m in held)
    assert mode is None or mode == MigMode(bool(wanted), bool(wanted))
