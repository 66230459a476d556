"""The dry-run re-carve advisor: layouts checked by NVIDIA's slice counts per card, the
fewest free instances destroyed, held instances never touched, the pod's nodes respected."""

from __future__ import annotations

import pytest

from elastic_gpu.core.mig.layout import layout_starts
from elastic_gpu.core.mig.profiles import mig_model
from elastic_gpu.core.mig.recarve import Recarve, layout_fits, recarve_advice
from elastic_gpu.core.mig.substitution import Constraints
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.resources import MigProfile

P = MigProfile.parse
A100_80 = mig_model("A100-SXM4-80GB")


@pytest.mark.parametrize(("layout", "fits"), [
    (["3g.40gb", "3g.40gb"], True),
    (["4g.40gb", "3g.40gb"], True),
    (["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"], True),
    (["1g.10gb"] * 7, True),
    (["1g.10gb"] * 8, False),                      # 7 compute slices
    (["3g.40gb", "3g.40gb", "1g.10gb"], False),    # 9 of 8 memory slices
    (["7g.80gb", "1g.10gb"], False),
    (["1g.20gb"] * 5, False),                      # 4 per card (and 10 memory slices)
    (["1g.10gb+me", "1g.10gb+me"], False),         # one +me per card
    (["1g.5gb"], False),                           # not a profile of this model
])
def test_layouts_by_nvidias_slice_counts(layout: list[str], fits: bool) -> None:
    assert A100_80 is not None
    assert layout_fits(A100_80, [P(p) for p in layout]) is fits


def card_node(name: str, *instances: str) -> Node:
    profiles = [P(p) for p in instances]
    starts = layout_starts("A100-SXM4-80GB", profiles)
    mig = tuple(MigInstance(p, f"MIG-{name}-{i}", s)
                for i, (p, s) in enumerate(zip(profiles, starts, strict=True)))
    return Node(name, 8000, 65536, (Card(0, f"GPU-{name}", "A100-SXM4-80GB", 81920, mig=mig),))


def test_uncarved_slices_are_advised_without_destroying_anything() -> None:
    nodes = [card_node("a", "2g.20gb", "1g.10gb", "1g.10gb")]
    advice = recarve_advice(P("3g.40gb"), nodes, {"MIG-a-0"})
    assert advice == Recarve("a", "GPU-a", "A100-SXM4-80GB", (), P("3g.40gb"),
                             (P("2g.20gb"), P("1g.10gb"), P("1g.10gb"), P("3g.40gb")))
    assert "destroy free nothing" in advice.message and "no layout is changed" in advice.message


def test_the_fewest_free_instances_are_destroyed_and_held_ones_never() -> None:
    nodes = [card_node("a", "1g.10gb", "2g.20gb", "2g.20gb", "2g.20gb")]
    advice = recarve_advice(P("4g.40gb"), nodes, {"MIG-a-0"})
    assert advice is not None
    assert advice.destroy == (P("2g.20gb"), P("2g.20gb"))
    assert advice.layout == (P("1g.10gb"), P("2g.20gb"), P("4g.40gb"))
    # everything held: nothing may be destroyed, and a 4g does not fit beside them
    assert recarve_advice(P("4g.40gb"), nodes, {f"MIG-a-{i}" for i in range(4)}) is None


def test_a_profile_the_model_lacks_gets_the_smallest_compatible_one() -> None:
    # a 40 GB A100 name asked on an 80 GB card: 1g.5gb -> 1g.10gb (same family, at least as big)
    advice = recarve_advice(P("1g.5gb"), [card_node("a", "7g.80gb")], set())
    assert advice is not None and advice.create == P("1g.10gb")
    assert advice.destroy == (P("7g.80gb"),)


def test_only_cards_the_pod_may_use() -> None:
    nodes = [card_node("a", "4g.40gb"), card_node("b", "2g.20gb")]
    held = {"MIG-a-0", "MIG-b-0"}
    assert recarve_advice(P("3g.40gb"), nodes, held).node == "a"  # type: ignore[union-attr]
    only_b = Constraints(nodes=frozenset({"b"}))
    assert recarve_advice(P("3g.40gb"), nodes, held, only_b).node == "b"  # type: ignore[union-attr]
    assert recarve_advice(P("3g.40gb"), nodes, held,
                          Constraints(denied_models=frozenset({"A100-SXM4-80GB"}))) is None


def test_held_instances_keep_their_places_so_counts_alone_are_not_enough() -> None:
    # 1g.10gb held at slots 1 and 5: the counts leave room for a 3g.40gb (2 + 3 of 7 slices),
    # but it may start only at 0 or 4, and each of those halves holds a held instance
    mig = (MigInstance(P("1g.10gb"), "MIG-h1", 1), MigInstance(P("1g.10gb"), "MIG-h5", 5))
    node = Node("a", 8000, 65536, (Card(0, "GPU-a", "A100-SXM4-80GB", 81920, mig=mig),))
    assert recarve_advice(P("3g.40gb"), [node], {"MIG-h1", "MIG-h5"}) is None
    assert recarve_advice(P("2g.20gb"), [node], {"MIG-h1", "MIG-h5"}) is not None
