"""The defragmentation controller on `egpu sandbox up` (issue 30, the sandbox must-show).

The sandbox is the user's (real CLI; kube-apiserver, kube-controller-manager making the
Deployments' pods and keeping PodDisruptionBudgets' status, kube-scheduler calling `egpu
scheduler`, `egpu webhook`, the sandbox's own `egpu controller` with defrag off as by default)
on four kwok nodes of one A100-80GB each. Beside it this module runs `egpu controller --only
defrag --config ...` (its own Lease), in report mode, then in move mode.

The cards are fragmented by movable 30-40 % shares of Deployments (each first pinned to its
node by a label only that node has, then every node gets every label, so a replacement may go
anywhere):

    frag-0: g 40 % (PDB maxUnavailable 0)     frag-1: h 40 % (the same PDB)
    frag-2: a bare pod, 70 % (labelled movable: a bare pod never moves all the same)
    frag-3: a 30 % + b 30 %

A whole-card pod is Pending. One move would free a card (g or h), but the PDB refuses both
evictions; the controller records each refusal once and never knocks again within the
cool-down, and then moves the two 30 % shares (the fewest left), after which the pending pod
binds on frag-3 (the card reserved for it before the evictions, `elasticgpu.io/defrag-
reservation`) and a's and b's replacements run elsewhere. The independent ledger check (the
burst tests': each card's assignments summed from the API's pods) finds nothing
over-allocated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.defrag_sandbox import (
    NS,
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
    pods,
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
- name: frag
  count: 4
  gpus: 1
  model: A100-SXM4-80GB
  memoryMiB: 81920
"""


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The sandbox's kubeconfig."""
    where = tmp_path_factory.mktemp("defragsb")
    (where / "cluster.yaml").write_text(CLUSTER_FILE)
    up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"), "--state-dir",
              str(where / "state"), "--kubeconfig", str(where / "kubeconfig"), timeout=300)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield where / "kubeconfig"
    finally:
        egpu("sandbox", "down", "--state-dir", str(where / "state"), timeout=120)


@pytest.fixture(scope="module")
def fragmented(kc: Path) -> dict[str, dict[str, Any]]:
    """The layout of the module docstring; app -> its pod as placed."""
    make_namespace(kc)
    nodes = sorted(n["metadata"]["name"] for n in get(kc, "nodes")["items"]
                   if n["metadata"]["name"].startswith("frag"))
    assert len(nodes) == 4, nodes
    homes = {"g": nodes[0], "h": nodes[1], "a": nodes[3], "b": nodes[3]}
    pin_homes(kc, homes)
    guarded = {"pdb": "guarded"}
    for app, percent, extra in (("g", 40, guarded), ("h", 40, guarded), ("a", 30, {}),
                                ("b", 30, {})):
        apply(kc, deployment(app, percent, extra))
    apply(kc, bare("bare", 70, nodes[2]))
    apply(kc, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "guarded"},
               "spec": {"maxUnavailable": 0, "selector": {"matchLabels": guarded}}})
    placed = wait_running(kc, ["g", "h", "a", "b", "bare"])
    assert {app: placed[app]["spec"]["nodeName"] for app in homes} == homes
    wait_for("the PDB's status (kube-controller-manager)", lambda: (get(
        kc, "pdb", "guarded", "-n", NS) or {}).get("status", {}).get("currentHealthy") == 2)
    open_homes(kc, nodes, list(homes))
    apply(kc, bare("whole", None, None))
    wait_unschedulable(kc, "whole")
    return placed


def uids(kc: Path) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kc)}


def test_report_mode_tells_the_plan_and_moves_nothing(
        kc: Path, fragmented: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    before = uids(kc)
    with defrag_controller(kc, tmp_path, "report"):
        (event,) = wait_for("a DefragPlanned Event", lambda: events(kc, "DefragPlanned"))
        assert event["involvedObject"]["name"] == "whole"
        assert "report mode, nothing moved: would move 1 pod(s)" in event["message"]
        # a few rounds later still nothing has moved
        wait_for("the plan reported again", lambda: any(
            e.get("count", 1) >= 2 for e in events(kc, "DefragPlanned")))
        # the plan is recorded on the pod, and `egpu top` shows it
        record = PlanRecord.from_json(wait_for("the plan record", lambda: (
            (get(kc, "pod", "whole", "-n", NS) or {}).get("metadata", {}).get(
                "annotations", {}).get(ann.DEFRAG_PLAN))))
        shown = egpu("top", "--kubeconfig", str(kc), timeout=60)
    assert record.mode == "report" and len(record.moves) == 1
    assert shown.returncode == 0, shown.stderr
    assert "defrag plans for 1 pending pod:" in shown.stdout
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.startswith(f"  {NS}/whole ")]
    assert "(report mode, nothing moved; planned " in line
    assert f"would move 1 pod(s): {record.moves[0].pod} from " in line
    assert uids(kc) == before
    assert not events(kc, "DefragMoved") and not events(kc, "DefragEvictionRefused")
    assert not (get(kc, "pod", "whole", "-n", NS) or {})["spec"].get("nodeName")


def test_move_mode_frees_a_card_for_the_pending_pod_and_pdbs_hold(
        kc: Path, fragmented: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    before = {app: pod["metadata"]["uid"] for app, pod in fragmented.items()}
    with defrag_controller(kc, tmp_path, "move") as process:
        whole = wait_bound(kc, "whole")
        # the replacements of the two moved shares run, elsewhere
        moved = {app: replacement(kc, app, before[app]) for app in ("a", "b")}
        wait_for("whole Running", lambda: running(kc, "whole"))
        refused = events(kc, "DefragEvictionRefused")
        made_room = events(kc, "DefragMadeRoom")
        moved_events = events(kc, "DefragMoved")
        log = process.log_path.read_text(errors="replace")
    home = fragmented["a"]["spec"]["nodeName"]
    assert whole["spec"]["nodeName"] == home, log[-4000:]
    # the freed card was reserved for it before anything moved (the extender kept it: a's
    # and b's 30 % replacements would have fit there again), and it got that card
    reservation = DefragReservation.from_json(
        whole["metadata"]["annotations"][ann.DEFRAG_RESERVATION])
    assert reservation.assignment.node == home
    assignment = Assignment.from_json(whole["metadata"]["annotations"][ann.ASSIGNMENT])
    assert {s.index for s in assignment.shares()} == \
        {s.index for s in reservation.assignment.shares()}
    assert all(p["spec"]["nodeName"] != home for p in moved.values())
    # the PDB held: g and h are the very pods placed first, on their nodes; the bare pod too
    for app in ("g", "h", "bare"):
        (pod,) = running(kc, app)
        assert pod["metadata"]["uid"] == before[app], app
        assert pod["spec"]["nodeName"] == fragmented[app]["spec"]["nodeName"]
    # each refusal told once on the pending pod (and once on the refused pod), never retried
    on_pending = [e for e in refused if e["involvedObject"]["name"] == "whole"]
    assert on_pending and all(e.get("count", 1) == 1 for e in refused), refused
    refused_pods = {e["involvedObject"]["name"] for e in refused} - {"whole"}
    assert refused_pods
    assert refused_pods <= {fragmented[app]["metadata"]["name"] for app in ("g", "h")}
    # the fewest moves left: a and b, each told on the moved pod and on the pending pod
    evicted = {e["involvedObject"]["name"] for e in moved_events}
    assert evicted == {fragmented[app]["metadata"]["name"] for app in ("a", "b")}
    assert len([e for e in made_room if e["involvedObject"]["name"] == "whole"]) == 2
    assert not over_allocated(kc)
