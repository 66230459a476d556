"""Dynamic MIG end to end on `egpu sandbox up` (issue 42, must-show): a group with
`migDynamic: true`, four A100-SXM4-80GB cards, no layout; the sandbox's own `egpu controller`
(run with `mig.dynamic` on, a 10 s merge cool-down, because a group opted in) writes
MigLayouts, its allocation-sync applies them on the kwok node as its agent would (fence,
settle, carve, publish, unfence).

1. a whole-card pod holds one card;
2. a `nvidia.com/mig-3g.40gb: 1` pod binds on another card, carved for it;
3. a `mig-1g.10gb` pod lands on that card's free slices;
4. the whole-card pod never loses its card;
5. once the MIG pods are gone, a pod asking three whole cards of the node binds (merge-back);
6. HAMi's own `dynamic_mig_example.yaml` (`vgpu-mode: mig`, 2 x 8000 MiB: two `1g.10gb`
   instances on two distinct cards, as HAMi gives them), created unchanged: the agent is
   SIGKILLed right after its first step is published (a card fenced, carved mid-change), then
   the controller; both restarted, the pod binds on two cards, and the independent ledger
   check finds nothing held twice or lost, no fence left.

Deadlines are generous for a loaded box; how fast it is, is bench/'s to measure.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.mig_sandbox import (
    allocation_sync,
    controller,
    create,
    get,
    sandbox_component,
    sandbox_up,
)
from egpu_testing.sandbox import kubectl
from egpu_testing.waiting import wait_for
from egpu_testing.workbench import card_use_from_pods, mig_overheld, overcommitted
from elastic_gpu.api import gpudevice
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Health

pytestmark = pytest.mark.integration

NODE = "dyn-000"
NS = "dyn"
CLUSTER_FILE = """\
nodeGroups:
- {name: dyn, count: 1, gpus: 4, model: A100-SXM4-80GB, memoryMiB: 81920, migDynamic: true}
"""
DEADLINE_S = 180.0
HAMI_EXAMPLE = Path(__file__).resolve().parents[2] / "peerdata" / "hami" / \
    "dynamic_mig_example.yaml"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from sandbox_up(tmp_path_factory.mktemp("migdyn"), CLUSTER_FILE, NS)


def pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "cuda:fake",
                                     "resources": {"limits": limits}}]}}


def bound(box: Path, name: str) -> dict[str, Any]:
    def placed() -> dict[str, Any] | None:
        obj = get(box, "pod", name, "-n", NS)
        if obj and obj["spec"].get("nodeName") and \
                ann.ASSIGNMENT in obj["metadata"].get("annotations", {}):
            return dict(obj)
        return None
    return dict(wait_for(f"pod {name} bound", placed, timeout_s=DEADLINE_S))


def cards_of(obj: dict[str, Any]) -> list[tuple[str, str | None]]:
    assignment = Assignment.from_json(obj["metadata"]["annotations"][ann.ASSIGNMENT])
    return sorted((s.uuid, s.mig_uuid) for s in assignment.shares())


def gpu_cards(box: Path) -> dict[str, Any]:
    nodes = gpudevice.nodes_from_objects(get(box, "gpudevices")["items"])
    return {c.uuid: c for n in nodes for c in n.cards}


def delete(box: Path, *names: str) -> None:
    kubectl(box / "kubeconfig", "delete", "pod", "-n", NS, "--wait=true", *names)


def ledger_problems(box: Path) -> list[str]:
    """The independent check: cards summed from the API's pods against the GPUDevices, each
    MIG instance held once and carved where named, no whole-card share on a carved card, no
    fence left, every MigLayout applied as its card is."""
    pods = get(box, "pods", "-A")["items"]
    devices = get(box, "gpudevices")["items"]
    nodes = gpudevice.nodes_from_objects(devices)
    problems = overcommitted(card_use_from_pods(pods), nodes) + mig_overheld(pods, nodes)
    cards = {c.uuid: c for n in nodes for c in n.cards}
    for obj in pods:
        text = obj["metadata"].get("annotations", {}).get(ann.ASSIGNMENT)
        if not text or obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for share in Assignment.from_json(text).shares():
            if share.mig_uuid is None and cards[share.uuid].mig:
                problems.append(f"{obj['metadata']['name']} holds carved card {share.uuid} whole")
    problems += [f"{c.uuid} still fenced" for c in cards.values() if c.health is Health.FENCED]
    for layout in get(box, "miglayouts")["items"]:
        status = layout.get("status", {})
        real = sorted((m.profile.name, m.start) for m in cards[layout["spec"]["cardUUID"]].mig)
        wanted = sorted((i["profile"], i["start"]) for i in layout["spec"]["instances"])
        if status.get("phase") != "Applied" or real != wanted:
            problems.append(f"MigLayout {layout['metadata']['name']}: {status}, card {real}")
    return problems


def test_dynamic_mig_must_show(box: Path) -> None:
    _, argv, _ = sandbox_component(box, "egpu-controller")
    assert "--config" in argv  # the sandbox runs its controller with mig.dynamic on
    create(box, pod("whole", {"nvidia.com/gpu": "1"}))
    whole = bound(box, "whole")
    ((held_card, _),) = cards_of(whole)

    create(box, pod("m3", {"nvidia.com/mig-3g.40gb": "1"}))
    m3 = bound(box, "m3")
    ((carved, instance),) = cards_of(m3)
    assert carved != held_card and instance is not None
    assert [m.profile.name for m in gpu_cards(box)[carved].mig] == ["3g.40gb"]

    create(box, pod("m1", {"nvidia.com/mig-1g.10gb": "1"}))
    ((card_1g, _),) = cards_of(bound(box, "m1"))
    assert card_1g == carved  # the free slices of the carved card, not a second card
    assert sorted(m.profile.name for m in gpu_cards(box)[carved].mig) == ["1g.10gb", "3g.40gb"]
    assert ledger_problems(box) == []

    delete(box, "m3", "m1")
    create(box, pod("three", {"nvidia.com/gpu": "3"}))
    three = bound(box, "three")  # merged back after the cool-down
    assert carved in {uuid for uuid, _ in cards_of(three)}
    assert gpu_cards(box)[carved].mig == ()
    again = get(box, "pod", "whole", "-n", NS)
    assert again["metadata"]["uid"] == whole["metadata"]["uid"]
    assert cards_of(again) == [(held_card, None)]  # never lost its card
    assert ledger_problems(box) == []

    # the agent SIGKILLed mid-change, then the controller
    delete(box, "three")
    sync_pid, _, _ = sandbox_component(box, "allocation-sync")
    os.kill(sync_pid, signal.SIGKILL)
    crashing = allocation_sync(box, "crash.log", crash=True)
    crashing.start()
    kubectl(box / "kubeconfig", "create", "-n", NS, "-f", str(HAMI_EXAMPLE))
    wait_for("the agent's crash", lambda: crashing.process is not None
             and crashing.process.poll() == -signal.SIGKILL, timeout_s=DEADLINE_S)
    fenced = [c for c in gpu_cards(box).values() if c.health is Health.FENCED]
    assert [len(c.mig) for c in fenced if c.mig] == [1]  # one card fenced, carved mid-change
    ctl_pid, ctl = controller(box, "controller.log")
    os.kill(ctl_pid, signal.SIGKILL)
    sync = allocation_sync(box, "sync.log")
    sync.start()
    try:
        ctl.start()
        hami = bound(box, "gpu-pod")
        limits = hami["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/mig-1g.10gb"] == "2"
        # HAMi's `nvidia.com/gpu: 2` is two cards: one instance on each of two distinct cards
        held = cards_of(hami)
        assert len({uuid for uuid, _ in held}) == 2 and all(mig for _, mig in held)
        assert next(c.uuid for c in fenced if c.mig) in {uuid for uuid, _ in held}
        assert held_card not in {uuid for uuid, _ in held}
        wait_for("no fence left, every layout applied", lambda: ledger_problems(box) == [],
                 timeout_s=DEADLINE_S)
        assert cards_of(get(box, "pod", "whole", "-n", NS)) == [(held_card, None)]
    finally:
        sync.stop()
        ctl.stop()
