"""`Engine.rekey`: an allocation moved to another key leaves the engine as release then
allocate of the same entry would, and refuses what would lose or merge an allocation."""

from __future__ import annotations

import pytest
from engine_helpers import gpu_node, mig, mig_node, share, whole

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.fit import FitKind
from elastic_gpu.core.placement import Engine, Unschedulable


def loaded() -> tuple[Engine, dict[str, Assignment]]:
    """An engine holding a share (with its host resources), whole cards and a MIG instance
    under reservation-style keys, and a bound pod's hold beside them."""
    engine = Engine([gpu_node("n1", cards=2, cpu=8000), gpu_node("n2", cards=2), mig_node()])
    placed: dict[str, Assignment] = {}
    for key, pod in (("uid-a#bind1", share("a", 300, 2000, cpu=3000, mem=4096)),
                     ("uid-w#bind1", whole("w", 2)),
                     ("uid-m#bind1", mig("m")),
                     ("uid-b", share("b", 500))):
        assignment = engine.place(pod)
        engine.allocate(key, assignment, pod)
        placed[key] = assignment
    return engine, placed


def snapshot(engine: Engine) -> tuple[object, ...]:
    """Everything a caller can read of the ledger and what decisions see of it."""
    probes = (share("p1", 600), share("p2", 200, cpu=6000), whole("p3", 1), mig("p4"))
    return (list(engine.allocations().items()),
            {n: engine.card_usage(n) for n in engine.nodes()},
            {n: engine.host_usage(n) for n in engine.nodes()},
            [engine.filter(p).feasible for p in probes],
            [engine.score(p, engine.nodes()) for p in probes])


@pytest.mark.parametrize("key", ["uid-a#bind1", "uid-w#bind1", "uid-m#bind1"])
def test_rekey_leaves_the_state_release_and_allocate_would(key: str) -> None:
    moved, placed = loaded()
    expected, _ = loaded()
    pod = {"uid-a#bind1": share("a", 300, 2000, cpu=3000, mem=4096),
           "uid-w#bind1": whole("w", 2), "uid-m#bind1": mig("m")}[key]
    new = key.split("#")[0]

    assert moved.rekey(key, new) == placed[key]
    expected.release(key)
    expected.allocate(new, placed[key], pod)

    assert snapshot(moved) == snapshot(expected)
    assert moved.allocation(key) is None and moved.allocation(new) == placed[key]


def test_a_rekeyed_mig_instance_names_its_new_holder() -> None:
    engine, placed = loaded()
    engine.rekey("uid-m#bind1", "uid-m")
    with pytest.raises(Unschedulable) as err:
        engine.allocate("uid-other", placed["uid-m#bind1"])
    assert err.value.failure.kind is FitKind.MIG_INSTANCE_HELD
    assert err.value.failure.holder == "uid-m"
    engine.allocate("uid-m", placed["uid-m#bind1"])  # its own: the same entry, a no-op
    assert engine.release("uid-m") == placed["uid-m#bind1"]
    engine.allocate("uid-other", placed["uid-m#bind1"])  # free again once released


def test_rekey_on_a_stale_layout_equals_release_and_allocate() -> None:
    moved, placed = loaded()
    expected, _ = loaded()
    for engine in (moved, expected):
        engine.upsert_node(gpu_node("n3", cards=1))  # the arrays are rebuilt on next use
    moved.rekey("uid-m#bind1", "uid-m")
    expected.release("uid-m#bind1")
    expected.allocate("uid-m", placed["uid-m#bind1"])
    assert snapshot(moved) == snapshot(expected)
    with pytest.raises(Unschedulable) as err:
        moved.allocate("uid-other", placed["uid-m#bind1"])
    assert err.value.failure.holder == "uid-m"


def test_rekey_refuses_an_unknown_key_and_a_taken_one_and_changes_nothing() -> None:
    engine, _ = loaded()
    before = snapshot(engine)
    with pytest.raises(KeyError):
        engine.rekey("uid-x#bind1", "uid-x")
    with pytest.raises(ValueError, match="uid-b already holds"):
        engine.rekey("uid-a#bind1", "uid-b")
    assert snapshot(engine) == before
