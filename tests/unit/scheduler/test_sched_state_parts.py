"""The state's parts built alone, each from a `StateHandle` and stand-ins for the parts it
calls (`egpu_testing.state_parts`): what a part asks of another is its constructor's seam."""

from __future__ import annotations

import pytest

from egpu_testing.state_parts import RecordingFreeing, RecordingLedger
from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.model import Card
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.state import NodeInfo
from elastic_gpu.scheduler.state.handle import StateHandle
from elastic_gpu.scheduler.state.inventory import Inventory
from elastic_gpu.scheduler.state.wakeups import Wakeups

GPU_POD = pod_request_from_manifest(
    pod_manifest("p", uid="uid-p", limits={"elasticgpu.io/gpu-core": "50"}))


def _inventory(nodes: int) -> tuple[StateHandle, RecordingLedger, RecordingFreeing, Inventory]:
    handle, ledger, freeing = StateHandle(), RecordingLedger(), RecordingFreeing()
    inventory = Inventory(handle, ledger, freeing)
    inventory.replace_nodes(NodeInfo(f"n{i}", 8000, 16384) for i in range(nodes))
    return handle, ledger, freeing, inventory


def test_a_relist_of_many_nodes_builds_one_engine_and_has_the_ledger_count_everything_once(
        ) -> None:
    handle, ledger, freeing, inventory = _inventory(100)
    first = handle.engine
    assert handle.stale_nodes and not handle.known  # not in the engine until a flush
    inventory.flush()
    assert handle.engine is not first and len(handle.engine.nodes()) == 100
    assert ledger.calls == ["all"]
    assert sorted(freeing.freed) == sorted(f"n{i}" for i in range(100))
    assert handle.known == frozenset(f"n{i}" for i in range(100)) and not handle.stale_nodes


def test_one_changed_node_is_updated_in_the_same_engine_and_only_its_holds_counted_again(
        ) -> None:
    handle, ledger, freeing, inventory = _inventory(100)
    inventory.flush()
    engine, version = handle.engine, handle.version
    ledger.calls.clear()
    freeing.freed.clear()
    inventory.upsert_device("n7-gpu0", "n7", Card(0, "GPU-n7-0", "A100", 40960))
    inventory.flush()
    assert handle.engine is engine and len(engine.node("n7").cards) == 1
    assert ledger.calls == ["node n7", "conflicts"] and freeing.freed == ["n7"]
    assert handle.version > version


def test_a_gpu_pod_fitting_nowhere_waits_with_the_priority_asked_then() -> None:
    handle = StateHandle()
    handle.known = frozenset({"a", "b", "c"})
    wakeups = Wakeups(handle)
    wakeups.note_filtered(GPU_POD, "uid-p", ["a", "b"], [], lambda: 7)
    waiter = wakeups.waiting()["uid-p"]
    assert (waiter.priority, waiter.nodes) == (7, frozenset({"a", "b"}))
    assert wakeups.wakeup_stats() == (1, {"turned_away": 1})


def test_a_pod_that_fits_waits_no_more_and_its_priority_is_never_asked() -> None:
    wakeups = Wakeups(StateHandle())
    wakeups.note_filtered(GPU_POD, "uid-p", ["a"], [], lambda: 0)

    def never() -> int:
        pytest.fail("the priority of a pod that fits is not needed")

    wakeups.note_filtered(GPU_POD, "uid-p", ["a"], ["a"], never)
    assert wakeups.waiting() == {}
