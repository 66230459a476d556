"""`Engine.holdable_part`: what of an assignment a key could hold now (`ledger.holdable`), for
a defragmentation reservation written while the pods it moves still hold some of its cards."""

from __future__ import annotations

from engine_helpers import gpu_node, mig_node

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine

IX = "iluvatar.com/gpu"


def on(node: str, *shares: CardShare) -> Assignment:
    return Assignment(node, {"main": shares})


def card(index: int, milli: int, memory: int = 0, node: str = "n1", replicas: int = 0
         ) -> CardShare:
    return CardShare(index, f"GPU-{node}-{index}", milli, memory, replicas=replicas)


def test_a_share_is_clipped_to_what_its_card_has_left_and_then_allocates() -> None:
    engine = Engine([gpu_node("n1", cards=2, memory=16000)])
    engine.allocate("a", on("n1", card(0, 300, 4000)))
    engine.allocate("b", on("n1", card(0, 300, 4000)))
    wanted = on("n1", card(0, 800, 12000), card(1, 500, 2000))
    part = engine.holdable_part("r", wanted)
    assert part == on("n1", card(0, 400, 8000), card(1, 500, 2000))
    engine.allocate("r", part)  # what it says can be held can be
    assert engine.card_usage("n1") == [(0, 1000, 16000), (1, 500, 2000)]
    # with everything free it is the whole assignment
    engine.release("a")
    engine.release("b")
    engine.release("r")
    assert engine.holdable_part("r", wanted) == wanted


def test_two_shares_on_one_card_share_what_is_left() -> None:
    engine = Engine([gpu_node("n1", cards=1, memory=16000)])
    engine.allocate("a", on("n1", card(0, 700)))
    wanted = Assignment("n1", {"x": (card(0, 200),), "y": (card(0, 200),)})
    assert engine.holdable_part("r", wanted) == Assignment(
        "n1", {"x": (card(0, 200),), "y": (card(0, 100),)})


def test_mig_instances_another_key_holds_are_left_out() -> None:
    engine = Engine([mig_node("m")])
    a, b = (CardShare(0, "GPU-m-0", 0, 40960, "3g.40gb", f"MIG-m-{k}") for k in "ab")
    engine.allocate("moved", on("m", a))
    assert engine.holdable_part("pair", on("m", a, b)) == on("m", b)
    assert engine.holdable_part("moved", on("m", a, b)) == on("m", a, b)  # its own: holdable
    engine.allocate("other", on("m", b))
    assert engine.holdable_part("pair", on("m", a, b)) is None


def test_a_replica_share_is_whole_or_not_at_all() -> None:
    offers = {IX: 4, "elasticgpu.io/gpu-core": 100, "elasticgpu.io/gpu-memory": 16384}
    engine = Engine([Node("ix", 64000, 1 << 18, (Card(0, "GPU-ix-0", "T4", 16384,
                                                      offers=offers),))])
    slot = CardShare(0, "GPU-ix-0", 250, 0, replicas=1)
    engine.allocate("s", on("ix", CardShare(0, "GPU-ix-0", 600, 0)))
    assert engine.holdable_part("r", on("ix", slot)) == on("ix", slot)  # 600 + 250 fit
    engine.allocate("s", on("ix", CardShare(0, "GPU-ix-0", 900, 0)))
    assert engine.holdable_part("r", on("ix", slot)) is None  # not clipped to 100


def test_nothing_left_or_an_unknown_node_or_card_is_none() -> None:
    engine = Engine([gpu_node("n1", cards=1)])
    engine.allocate("a", on("n1", card(0, 1000)))
    assert engine.holdable_part("r", on("n1", card(0, 100))) is None
    assert engine.holdable_part("r", on("ghost", card(0, 100, node="ghost"))) is None
    assert engine.holdable_part("r", on("n1", card(7, 100))) is None
