"""One answer to "does this pod still hold its card?" (`core.podlife.holds_cards`), in every
view: the extender's ledger, the node agent's allocation columns and Allocate's over-commit
check, `egpu top` and the MIG controller's held instances. A pod being deleted whose
container still runs holds its card in all of them; once its containers are reported
terminated, none of them counts it (issue #39)."""

from __future__ import annotations

from typing import Any

import pytest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.agent.accounting import card_usage, overcommit
from elastic_gpu.agent.matching import candidates
from elastic_gpu.api.gpudevice import card_to_object
from elastic_gpu.cli.top import Objects, view_from_objects
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.mig.substitution import bound_pod, held_instances
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.podlife import holds_cards
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.scheduler.binder import with_binding

NODE = "n1"
CORE = "elasticgpu.io/gpu-core"
CARD = Card(0, "GPU-n1-0", "A100", 40960)
RUNS = {"running": {"startedAt": "2026-11-28T14:00:00Z"}}
DONE = {"terminated": {"exitCode": 137}}


MIG_CARD = Card(0, "GPU-n1-0", "A100-SXM4-40GB", 40960,
                mig=(MigInstance(MigProfile.parse("3g.20gb"), "MIG-a", 0),))
MIG_SHARE = CardShare(0, MIG_CARD.uuid, 0, 20480, "3g.20gb", "MIG-a")
WHOLE = CardShare(0, CARD.uuid, 1000, 0)


def bound(name: str, phase: str = "Running",
          held: CardShare = WHOLE) -> dict[str, Any]:
    limits = {f"nvidia.com/mig-{held.mig_profile}": "1"} if held.mig_profile else {CORE: "100"}
    pod = pod_manifest(name, uid=f"uid-{name}", limits=limits)
    pod = with_binding(pod, NODE, Assignment(NODE, {"main": (held,)}))
    return {**pod, "spec": {**pod["spec"], "nodeName": NODE}, "status": {"phase": phase}}


def leaving(state: dict[str, Any], held: CardShare = WHOLE
            ) -> dict[str, Any]:
    """The card's holder being deleted (a finalizer or its grace period keeps it), its one
    container in `state`."""
    pod = bound("old", held=held)
    return {**pod, "metadata": {**pod["metadata"], "resourceVersion": "10",
                                "deletionTimestamp": "2026-11-28T15:00:00Z"},
            "status": {"phase": "Running",
                       "containerStatuses": [{"name": "main", "state": state}]}}


def extender_milli(pod: dict[str, Any]) -> int:
    state = ready_state([Node(NODE, 64_000, 256_000, (CARD,))])
    state.observe_pod(bound("old"))
    state.observe_pod(pod)
    return sum(milli for _, milli, _ in state.card_usage()[NODE])


def agent_milli(pod: dict[str, Any]) -> int:
    use = card_usage([pod], NODE, {0: CARD}).get(0)
    return use.milli if use is not None else 0


def agent_refuses_a_newcomer(pod: dict[str, Any]) -> bool:
    newcomer = bound("new", phase="Pending")
    (chosen,), _ = candidates([newcomer], NODE, CORE, 100, ())
    return overcommit(chosen, [pod, newcomer], NODE, {0: CARD.memory_mib}) is not None


def top_milli(pod: dict[str, Any]) -> int:
    view = view_from_objects(Objects(nodes=[{"metadata": {"name": NODE}}],
                                     devices=[card_to_object(NODE, CARD)], pods=[pod],
                                     elasticgpus=[]))
    return view.nodes[0].cards[0].used_milli


def mig_controller_held(pod: dict[str, Any]) -> set[str]:
    bound_pods = [b for b in [bound_pod(pod)] if b is not None]
    return held_instances([Node(NODE, 64_000, 256_000, (MIG_CARD,))], bound_pods)


def test_a_terminating_pod_whose_container_runs_holds_its_card_in_every_view() -> None:
    pod = leaving(RUNS)
    assert holds_cards(pod)
    assert extender_milli(pod) == 1000
    assert agent_milli(pod) == 1000
    assert agent_refuses_a_newcomer(pod)
    assert top_milli(pod) == 1000
    assert mig_controller_held(leaving(RUNS, MIG_SHARE)) == {"MIG-a"}


def test_once_its_containers_are_reported_terminated_no_view_counts_it() -> None:
    pod = leaving(DONE)
    assert not holds_cards(pod)
    assert extender_milli(pod) == 0
    assert agent_milli(pod) == 0
    assert not agent_refuses_a_newcomer(pod)
    assert top_milli(pod) == 0
    assert mig_controller_held(leaving(DONE, MIG_SHARE)) == set()


@pytest.mark.parametrize("pod", [
    {"spec": {}, "status": {"phase": "Running"}},  # not bound: a reservation is the extender's
    {"spec": {"nodeName": NODE}, "status": {"phase": "Succeeded"}},
])
def test_an_unbound_or_finished_pod_holds_nothing(pod: dict[str, Any]) -> None:
    assert not holds_cards(pod)
