"""The defragmentation controller makes room for a pending MIG pod by moving a pod between
existing instances (issue 30's MIG must-show; no MIG layout is re-carved) on `egpu sandbox up`
with two kwok nodes of one A100-80GB each, carved into two 3g.40gb instances:

    mig-0: m, a movable Deployment's pod on one 3g.40gb; the other instance free
    mig-1: keep, a bare pod on one 3g.40gb (never moves); the other instance free

A pod asking two 3g.40gb instances (one container, e.g. two tensor-parallel ranks on one node)
is Pending although two instances are free: one per node. The fewest moves: m to mig-1's free
instance. The controller reserves both of mig-0's instances for the pending pod, evicts m; the
pending pod binds on mig-0's two instances, m's replacement runs on mig-1, the bare pod keeps
its uid, and the independent ledger check (cards and MIG instances, summed from the API's
pods) finds nothing over-allocated or held twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_testing.defrag_sandbox import (
    apply,
    bare,
    defrag_controller,
    deployment,
    events,
    get,
    make_namespace,
    open_homes,
    over_allocated,
    pin_homes,
    replacement,
    running,
    wait_bound,
    wait_running,
    wait_unschedulable,
)
from egpu_testing.sandbox import egpu
from egpu_testing.waiting import wait_for
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.defrag.record import PlanRecord
from elastic_gpu.core.defrag.reservation import DefragReservation

pytestmark = pytest.mark.integration

CLUSTER_FILE = """\
nodeGroups:
- name: mig
  count: 2
  gpus: 1
  model: A100-SXM4-80GB
  memoryMiB: 81920
  mig: [3g.40gb, 3g.40gb]
"""
ONE = {"nvidia.com/mig-3g.40gb": "1"}
TWO = {"nvidia.com/mig-3g.40gb": "2"}


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("defragmig")
    (where / "cluster.yaml").write_text(CLUSTER_FILE)
    up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"), "--state-dir",
              str(where / "state"), "--kubeconfig", str(where / "kubeconfig"), timeout=300)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield where / "kubeconfig"
    finally:
        egpu("sandbox", "down", "--state-dir", str(where / "state"), timeout=120)


def instances_of(assignment: Assignment) -> list[str]:
    return sorted(s.mig_uuid or "" for s in assignment.shares())


def instances(pod: dict[str, object]) -> list[str]:
    text = pod["metadata"]["annotations"][ann.ASSIGNMENT]  # type: ignore[index]
    return instances_of(Assignment.from_json(str(text)))


def test_a_pending_two_instance_pod_binds_after_one_pod_moves_to_a_free_instance(
        kc: Path, tmp_path: Path) -> None:
    make_namespace(kc)
    nodes = sorted(n["metadata"]["name"] for n in get(kc, "nodes")["items"])
    first, second = nodes
    pin_homes(kc, {"m": first})
    apply(kc, deployment("m", None, limits=ONE))
    apply(kc, bare("keep", None, second, limits=ONE))
    placed = wait_running(kc, ["m", "keep"])
    assert placed["m"]["spec"]["nodeName"] == first
    (m_instance,) = instances(placed["m"])
    open_homes(kc, nodes, ["m"])
    apply(kc, bare("pair", None, None, limits=TWO))
    wait_unschedulable(kc, "pair")
    with defrag_controller(kc, tmp_path, "move") as process:
        pair = wait_bound(kc, "pair")
        moved = replacement(kc, "m", placed["m"]["metadata"]["uid"])
        wait_for("pair Running", lambda: running(kc, "pair"))
        moved_events = events(kc, "DefragMoved")
        log = process.log_path.read_text(errors="replace")
    assert pair["spec"]["nodeName"] == first, log[-4000:]
    # the reservation the controller wrote before the eviction named both of first's
    # instances, and the pod got them: the one m left among them
    reservation = DefragReservation.from_json(
        pair["metadata"]["annotations"][ann.DEFRAG_RESERVATION])
    reserved = sorted(s.mig_uuid or "" for s in reservation.assignment.shares())
    assert reservation.assignment.node == first and m_instance in reserved
    (pair_now,) = running(kc, "pair")
    assert instances(pair_now) == reserved
    # the plan record (what `egpu top` showed while it was pending) names the move's instances
    record = PlanRecord.from_json(pair["metadata"]["annotations"][ann.DEFRAG_PLAN])
    (planned,) = record.moves
    assert record.mode == "move" and record.placement == reservation.assignment
    assert planned.pod.endswith("/" + placed["m"]["metadata"]["name"])
    assert instances_of(planned.source) == [m_instance] and planned.target.node == second
    assert moved["spec"]["nodeName"] == second
    assert [e["involvedObject"]["name"] for e in moved_events] == [
        placed["m"]["metadata"]["name"]]
    assert "MIG 3g.40gb" in moved_events[0]["message"]
    (keep,) = running(kc, "keep")
    assert keep["metadata"]["uid"] == placed["keep"]["metadata"]["uid"]
    assert instances(keep) == instances(placed["keep"])
    assert not over_allocated(kc)
