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
binds on frag-3 and a's and b's replacements run elsewhere. The independent ledger check (the
burst tests': each card's assignments summed from the API's pods) finds nothing
over-allocated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.controller import ControllerProcess
from egpu_testing.sandbox import egpu, kubectl, kubectl_run
from egpu_testing.waiting import wait_for
from egpu_testing.workbench import card_use_from_pods, overcommitted
from elastic_gpu.api import gpudevice
from elastic_gpu.core.annotations import MOVABLE_LABEL
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

CLUSTER_FILE = """\
nodeGroups:
- name: frag
  count: 4
  gpus: 1
  model: A100-SXM4-80GB
  memoryMiB: 81920
"""
NS = "defrag"
#: generous for a loaded box: no test asserts a duration
DEADLINE_S = 180.0
CONFIG = """\
defrag:
  enabled: true
  mode: {mode}
  maxMoves: 2
  coolDownSeconds: 3600
  settleSeconds: 60
"""


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("defragsb")
    (where / "cluster.yaml").write_text(CLUSTER_FILE)
    up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"), "--state-dir",
              str(where / "state"), "--kubeconfig", str(where / "kubeconfig"), timeout=300)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield where
    finally:
        egpu("sandbox", "down", "--state-dir", str(where / "state"), timeout=120)


def kc(box: Path) -> Path:
    return box / "kubeconfig"


def get(box: Path, *what: str) -> Any:
    result = kubectl_run(kc(box), "get", *what, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def apply(box: Path, obj: dict[str, Any]) -> None:
    kubectl(kc(box), "apply", "-n", NS, "-f", "-", input=json.dumps(obj))


def pods(box: Path) -> list[dict[str, Any]]:
    return list((get(box, "pods", "-n", NS) or {}).get("items", []))


def running(box: Path, app: str) -> list[dict[str, Any]]:
    return [p for p in pods(box) if p["metadata"].get("labels", {}).get("app") == app
            and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") == "Running"]


def events(box: Path, reason: str) -> list[dict[str, Any]]:
    items = (get(box, "events", "-n", NS) or {}).get("items", [])
    return [e for e in items if e.get("reason") == reason]


def pod_spec(percent: int | None, selector: dict[str, str]) -> dict[str, Any]:
    limits = {"nano-gpu/gpu-percent": str(percent)} if percent else {"nvidia.com/gpu": "1"}
    return {"nodeSelector": selector, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "cuda:fake",
                            "resources": {"limits": limits}}]}


def deployment(name: str, percent: int, labels: dict[str, str]) -> dict[str, Any]:
    labels = {"app": name, MOVABLE_LABEL: "true", **labels}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": pod_spec(percent, {f"defrag-home-{name}": "yes"})}}}


def bare(name: str, percent: int | None, node: str | None) -> dict[str, Any]:
    selector = {"kubernetes.io/hostname": node} if node else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name, MOVABLE_LABEL: "true"}},
            "spec": pod_spec(percent, selector)}


@pytest.fixture(scope="module")
def fragmented(box: Path) -> dict[str, dict[str, Any]]:
    """The layout of the module docstring; app -> its pod as placed."""
    kubectl(kc(box), "create", "namespace", NS)
    wait_for("the default ServiceAccount", lambda: get(box, "sa", "default", "-n", NS))
    nodes = sorted(n["metadata"]["name"] for n in get(box, "nodes")["items"]
                   if n["metadata"]["name"].startswith("frag"))
    assert len(nodes) == 4, nodes
    homes = {"g": nodes[0], "h": nodes[1], "a": nodes[3], "b": nodes[3]}
    for app, node in homes.items():
        kubectl(kc(box), "label", "node", node, f"defrag-home-{app}=yes")
    guarded = {"pdb": "guarded"}
    for app, percent, extra in (("g", 40, guarded), ("h", 40, guarded), ("a", 30, {}),
                                ("b", 30, {})):
        apply(box, deployment(app, percent, extra))
    apply(box, bare("bare", 70, nodes[2]))
    apply(box, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "guarded"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": guarded}}})
    placed = {}
    for app in ("g", "h", "a", "b", "bare"):
        (pod,) = wait_for(f"{app} Running", lambda app=app: running(box, app),
                          timeout_s=DEADLINE_S)
        placed[app] = pod
    assert {app: placed[app]["spec"]["nodeName"] for app in homes} == homes
    wait_for("the PDB's status (kube-controller-manager)", lambda: (get(
        box, "pdb", "guarded", "-n", NS) or {}).get("status", {}).get("currentHealthy") == 2)
    for node in nodes:  # from now on a replacement may go to any node
        kubectl(kc(box), "label", "node", node, "--overwrite",
                *(f"defrag-home-{app}=yes" for app in homes))
    apply(box, bare("whole", None, None))
    wait_for("the whole-card pod Unschedulable", lambda: any(
        c.get("reason") == "Unschedulable"
        for c in (get(box, "pod", "whole", "-n", NS) or {}).get("status", {}).get(
            "conditions", [])), timeout_s=DEADLINE_S)
    return placed


def controller(box: Path, tmp: Path, mode: str) -> ControllerProcess:
    (tmp / f"{mode}.yaml").write_text(CONFIG.format(mode=mode))
    (port,) = free_ports(1)
    process = ControllerProcess(kc(box), port, tmp / f"defrag-{mode}.log",
                                extender_url="http://127.0.0.1:1", identity=f"defrag-{mode}",
                                lease_name=f"egpu-defrag-{mode}",
                                extra=["--only", "defrag", "--config", str(tmp / f"{mode}.yaml")])
    process.start()
    wait_for("the defrag controller leading", process.leading, timeout_s=60)
    return process


def uids(box: Path) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(box)}


def test_report_mode_tells_the_plan_and_moves_nothing(
        box: Path, fragmented: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    before = uids(box)
    process = controller(box, tmp_path, "report")
    try:
        (event,) = wait_for("a DefragPlanned Event", lambda: events(box, "DefragPlanned"),
                            timeout_s=DEADLINE_S)
        assert event["involvedObject"]["name"] == "whole"
        assert "report mode, nothing moved: would move 1 pod(s)" in event["message"]
        # a few rounds later still nothing has moved
        wait_for("the plan reported again", lambda: any(
            e.get("count", 1) >= 2 for e in events(box, "DefragPlanned")), timeout_s=DEADLINE_S)
    finally:
        process.stop()
    assert uids(box) == before
    assert not events(box, "DefragMoved") and not events(box, "DefragEvictionRefused")
    assert not (get(box, "pod", "whole", "-n", NS) or {})["spec"].get("nodeName")


def test_move_mode_frees_a_card_for_the_pending_pod_and_pdbs_hold(
        box: Path, fragmented: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    before = {app: pod["metadata"]["uid"] for app, pod in fragmented.items()}
    process = controller(box, tmp_path, "move")
    try:
        whole = wait_for("the whole-card pod bound", lambda: (lambda p: p if p and p["spec"].get(
            "nodeName") else None)(get(box, "pod", "whole", "-n", NS)), timeout_s=DEADLINE_S)
        # the replacements of the two moved shares run, elsewhere
        moved = {}
        for app in ("a", "b"):
            (pod,) = wait_for(f"{app}'s replacement Running", lambda app=app: [
                p for p in running(box, app) if p["metadata"]["uid"] != before[app]],
                timeout_s=DEADLINE_S)
            moved[app] = pod
        wait_for("whole Running", lambda: running(box, "whole"), timeout_s=DEADLINE_S)
        refused = events(box, "DefragEvictionRefused")
        made_room = events(box, "DefragMadeRoom")
        moved_events = events(box, "DefragMoved")
        log = process.log_path.read_text(errors="replace")
    finally:
        process.stop()
    home = fragmented["a"]["spec"]["nodeName"]
    assert whole["spec"]["nodeName"] == home, log[-4000:]
    assert all(p["spec"]["nodeName"] != home for p in moved.values())
    # the PDB held: g and h are the very pods placed first, on their nodes
    for app in ("g", "h", "bare"):
        (pod,) = running(box, app)
        assert pod["metadata"]["uid"] == before[app], app
        assert pod["spec"]["nodeName"] == fragmented[app]["spec"]["nodeName"]
    # each refusal told once on the pending pod (and once on the refused pod), never retried
    on_pending = [e for e in refused if e["involvedObject"]["name"] == "whole"]
    assert on_pending and all(e.get("count", 1) == 1 for e in refused), refused
    refused_pods = {e["involvedObject"]["name"] for e in refused} - {"whole"}
    assert refused_pods <= {fragmented[app]["metadata"]["name"] for app in ("g", "h")}
    assert refused_pods
    # the fewest moves left: a and b, each told on the moved pod and on the pending pod
    evicted = {e["involvedObject"]["name"] for e in moved_events}
    assert evicted == {fragmented[app]["metadata"]["name"] for app in ("a", "b")}
    assert len([e for e in made_room if e["involvedObject"]["name"] == "whole"]) == 2
    # the independent ledger check
    devices = get(box, "gpudevices")["items"]
    use = card_use_from_pods(pods(box))
    assert not overcommitted(use, gpudevice.nodes_from_objects(devices))
