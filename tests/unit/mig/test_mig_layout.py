"""NVIDIA's MIG placement rules per model (MIG user guide, profile placement figures;
`nvidia-smi mig -lgipp`): the starts each profile may take, `check_layout`'s reasons,
`fits_at` and `pack`."""

from __future__ import annotations

import pytest

from elastic_gpu.core.mig.layout import Placement, check_layout, fits_at, headroom, pack
from elastic_gpu.core.mig.profiles import MIG_MODELS, MigModel, mig_model
from elastic_gpu.core.resources import MigProfile

P = MigProfile.parse

# `nvidia-smi mig -lgipp` per model: profile -> ({starts}, size in slots)
PLACEMENTS: dict[str, dict[str, tuple[tuple[int, ...], int]]] = {
    "A30-24GB": {"1g.6gb": ((0, 1, 2, 3), 1), "1g.6gb+me": ((0, 1, 2, 3), 1),
                 "2g.12gb": ((0, 2), 2), "2g.12gb+me": ((0, 2), 2), "4g.24gb": ((0,), 4)},
    "A100-SXM4-40GB": {"1g.5gb": ((0, 1, 2, 3, 4, 5, 6), 1),
                       "1g.5gb+me": ((0, 1, 2, 3, 4, 5, 6), 1),
                       "1g.10gb": ((0, 2, 4, 6), 2), "2g.10gb": ((0, 2, 4), 2),
                       "3g.20gb": ((0, 4), 4), "4g.20gb": ((0,), 4), "7g.40gb": ((0,), 8)},
    "A100-80GB": {"1g.10gb": ((0, 1, 2, 3, 4, 5, 6), 1),
                  "1g.10gb+me": ((0, 1, 2, 3, 4, 5, 6), 1),
                  "1g.20gb": ((0, 2, 4, 6), 2), "2g.20gb": ((0, 2, 4), 2),
                  "3g.40gb": ((0, 4), 4), "4g.40gb": ((0,), 4), "7g.80gb": ((0,), 8)},
    "H200-141GB": {"1g.18gb": ((0, 1, 2, 3, 4, 5, 6), 1),
                   "1g.18gb+me": ((0, 1, 2, 3, 4, 5, 6), 1),
                   "1g.35gb": ((0, 2, 4, 6), 2), "2g.35gb": ((0, 2, 4), 2),
                   "3g.71gb": ((0, 4), 4), "4g.71gb": ((0,), 4), "7g.141gb": ((0,), 8)},
}
PLACEMENTS["H100-80GB"] = PLACEMENTS["A100-80GB"]


def model(name: str) -> MigModel:
    found = mig_model(name)
    assert found is not None
    return found


def test_every_model_has_its_placements() -> None:
    assert {m.name for m in MIG_MODELS} == set(PLACEMENTS)
    for m in MIG_MODELS:
        got = {r.profile.name: (r.starts, r.memory_slices) for r in m.profiles}
        assert got == PLACEMENTS[m.name], m.name
        assert m.slots == (4 if m.family == "A30" else 8)


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_every_start_rule_is_enforced_alone(name: str) -> None:
    m = model(name)
    for row in m.profiles:
        for start in range(m.slots):
            reason = check_layout(m, [Placement(row.profile, start)])
            if start in row.starts:
                assert reason is None
            else:
                assert reason is not None and "may start only at slot" in reason
        # no start leaves the card, and none needs compute the card lacks
        for start in row.starts:
            assert start + row.memory_slices <= m.slots
            assert start + row.compute_slices <= m.compute_slices


@pytest.mark.parametrize(("name", "layout", "reason"), [
    ("A100-80GB", ["2g.20gb@3"], "may start only at slot 0, 2, 4"),
    ("A100-80GB", ["3g.40gb@2"], "may start only at slot 0, 4"),
    ("A100-80GB", ["1g.10gb@7"], "may start only at slot"),    # slot 7: memory, no compute
    ("A100-80GB", ["4g.40gb@0", "3g.40gb@0"], "overlaps another instance"),
    ("A100-80GB", ["3g.40gb@4", "1g.20gb@6"], "overlaps another instance"),
    ("A100-80GB", ["1g.10gb+me@0", "1g.10gb+me@1"], "holds at most 1 1g.10gb+me"),
    ("A100-80GB", ["1g.5gb@0"], "not a MIG profile of A100-80GB"),
    ("H100-80GB", ["7g.80gb@0", "1g.10gb@0"], "overlaps"),
    ("H200-141GB", ["2g.35gb@6"], "may start only at slot 0, 2, 4"),
    ("A30-24GB", ["2g.12gb@1"], "may start only at slot 0, 2"),
    ("A30-24GB", ["4g.24gb@0", "1g.6gb@3"], "overlaps"),
    ("A100-SXM4-40GB", ["1g.10gb@0", "1g.10gb@2", "1g.10gb@4", "1g.10gb@6", "1g.5gb@1"],
     "overlaps"),
])
def test_bad_layouts_are_refused_with_the_reason(name: str, layout: list[str], reason: str) -> None:
    places = [Placement(P(t.split("@")[0]), int(t.split("@")[1])) for t in layout]
    got = check_layout(model(name), places)
    assert got is not None and reason in got


@pytest.mark.parametrize(("name", "layout"), [
    # NVIDIA's documented combinations, each as placed
    ("A100-80GB", ["4g.40gb@0", "2g.20gb@4", "1g.10gb@6"]),
    ("A100-80GB", ["4g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"]),
    ("A100-80GB", ["3g.40gb@0", "3g.40gb@4"]),
    ("A100-80GB", ["2g.20gb@0", "1g.10gb@2", "1g.10gb@3", "3g.40gb@4"]),
    ("A100-80GB", ["2g.20gb@0", "2g.20gb@2", "2g.20gb@4", "1g.10gb@6"]),
    ("A100-80GB", [f"1g.10gb@{s}" for s in range(7)]),
    ("A100-80GB", ["1g.20gb@0", "1g.20gb@2", "1g.20gb@4", "1g.20gb@6"]),
    ("A100-SXM4-40GB", ["3g.20gb@0", "2g.10gb@4", "1g.5gb@6"]),
    ("H200-141GB", ["4g.71gb@0", "3g.71gb@4"]),
    ("A30-24GB", ["2g.12gb@0", "1g.6gb@2", "1g.6gb@3"]),
    ("A30-24GB", ["2g.12gb+me@0", "2g.12gb@2"]),
])
def test_documented_combinations_are_valid(name: str, layout: list[str]) -> None:
    places = [Placement(P(t.split("@")[0]), int(t.split("@")[1])) for t in layout]
    assert check_layout(model(name), places) is None


def test_fits_at_lists_the_free_starts() -> None:
    m = model("A100-SXM4-80GB")
    held = [Placement(P("1g.10gb"), 6)]
    assert fits_at(m, held, P("2g.20gb")) == (0, 2, 4)
    assert fits_at(m, held, P("3g.40gb")) == (0,)
    assert fits_at(m, [Placement(P("1g.10gb"), 0)], P("4g.40gb")) == ()
    assert fits_at(m, [Placement(P("1g.10gb+me"), 0)], P("1g.10gb+me")) == ()
    assert fits_at(m, [], P("1g.5gb")) == ()


def test_pack_places_small_instances_where_the_large_ones_cannot_go() -> None:
    m = model("A100-SXM4-80GB")
    one = pack(m, [P("1g.10gb")])
    assert one == (Placement(P("1g.10gb"), 6),)    # a 4g.40gb and a 2g.20gb still fit
    three = pack(m, [P("3g.40gb")])
    assert three == (Placement(P("3g.40gb"), 4),)  # a 4g.40gb still fits at 0
    assert headroom(m, list(three)).largest == 4


def test_pack_keeps_order_and_fixed_instances() -> None:
    m = model("A100-SXM4-80GB")
    wanted = [P("3g.40gb"), P("2g.20gb"), P("1g.10gb"), P("1g.10gb")]
    placed = pack(m, wanted)
    assert placed is not None and [p.profile for p in placed] == wanted
    assert check_layout(m, placed) is None
    held = [Placement(P("2g.20gb"), 2)]
    beside = pack(m, [P("3g.40gb")], held)
    assert beside == (Placement(P("3g.40gb"), 4),)
    assert pack(m, [P("4g.40gb")], held) is None
    assert pack(m, [P("1g.10gb")] * 8) is None
    assert pack(m, [P("1g.5gb")]) is None
    assert pack(m, [P("1g.10gb")], [Placement(P("2g.20gb"), 3)]) is None   # bad fixed


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_pack_finds_every_single_profile_layout(name: str) -> None:
    m = model(name)
    for row in m.profiles:
        placed = pack(m, [row.profile] * row.max_instances)
        assert placed is not None, row.profile.name
        assert check_layout(m, placed) is None
        assert pack(m, [row.profile] * (row.max_instances + 1)) is None
