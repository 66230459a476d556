"""The defragmentation controller makes room for a 4-card pod (issue 30's sandbox must-show,
the multi-card part) on `egpu sandbox up`: one node of four A100-80GB and one of one.

    quad-0: s, a movable 40 % share of a Deployment, on one of its four cards
    one-0:  a bare pod of 50 % (never moves)

A pod asking for four whole cards is Pending (quad-0 has three free). The fewest moves: s to
one-0 (50 + 40 %); then the 4-card pod binds on quad-0, s's replacement runs on one-0, the
bare pod is untouched, and the independent ledger check finds nothing over-allocated.
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

pytestmark = pytest.mark.integration

CLUSTER_FILE = """\
nodeGroups:
- name: quad
  count: 1
  gpus: 4
  model: A100-SXM4-80GB
  memoryMiB: 81920
- name: one
  count: 1
  gpus: 1
  model: A100-SXM4-80GB
  memoryMiB: 81920
"""


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("defragquad")
    (where / "cluster.yaml").write_text(CLUSTER_FILE)
    up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"), "--state-dir",
              str(where / "state"), "--kubeconfig", str(where / "kubeconfig"), timeout=300)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield where / "kubeconfig"
    finally:
        egpu("sandbox", "down", "--state-dir", str(where / "state"), timeout=120)


def test_a_four_card_pod_gets_a_node_emptied_by_one_move(kc: Path, tmp_path: Path) -> None:
    make_namespace(kc)
    nodes = sorted(n["metadata"]["name"] for n in get(kc, "nodes")["items"])
    quad = next(n for n in nodes if n.startswith("quad"))
    one = next(n for n in nodes if n.startswith("one"))
    pin_homes(kc, {"s": quad})
    apply(kc, deployment("s", 40))
    apply(kc, bare("blocker", 50, one))
    placed = wait_running(kc, ["s", "blocker"])
    assert placed["s"]["spec"]["nodeName"] == quad
    open_homes(kc, [quad, one], ["s"])
    apply(kc, bare("big", None, None, cards=4))
    wait_unschedulable(kc, "big")
    with defrag_controller(kc, tmp_path, "move") as process:
        big = wait_bound(kc, "big")
        moved = replacement(kc, "s", placed["s"]["metadata"]["uid"])
        wait_for("big Running", lambda: running(kc, "big"))
        moved_events = events(kc, "DefragMoved")
        log = process.log_path.read_text(errors="replace")
    assert big["spec"]["nodeName"] == quad, log[-4000:]
    assert moved["spec"]["nodeName"] == one
    assert [e["involvedObject"]["name"] for e in moved_events] == [
        placed["s"]["metadata"]["name"]]
    (blocker,) = running(kc, "blocker")
    assert blocker["metadata"]["uid"] == placed["blocker"]["metadata"]["uid"]
    assert not over_allocated(kc)
