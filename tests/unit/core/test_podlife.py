"""`core.podlife`: when a pod can no longer use what it was given (issue #26)."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.agent.pods import node_selector
from elastic_gpu.cli.top import LIVE_PODS as TOP_PODS
from elastic_gpu.core.podlife import NOT_TERMINAL_SELECTOR, TERMINAL_PHASES, finished, stopped
from elastic_gpu.scheduler.apiworker import LIVE_PODS as EXTENDER_PODS


def pod(phase: str = "Running", deleting: bool = False,
        states: dict[str, dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T15:00:00Z"
    status: dict[str, Any] = {"phase": phase}
    if states is not None:
        status["containerStatuses"] = [{"name": n, "state": s} for n, s in states.items()]
    if init is not None:
        status["initContainerStatuses"] = init
    return {"metadata": meta, "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": status}


DONE = {"terminated": {"exitCode": 0}}
RUNS = {"running": {"startedAt": "2026-11-28T14:00:00Z"}}
WAITS = {"waiting": {"reason": "ContainerCreating"}}


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_terminal_phase_is_finished_and_stopped(phase: str) -> None:
    assert finished(pod(phase)) and stopped(pod(phase, states={"a": RUNS}))


@pytest.mark.parametrize(("deleting", "states", "expected"), [
    (False, {"a": DONE, "b": DONE}, False),  # not deleted: kubelet restarts per policy
    (True, {"a": DONE, "b": DONE}, True),
    (True, {"a": DONE, "b": RUNS}, False),
    (True, {"a": DONE, "b": WAITS}, False),  # may be starting: statuses lag kubelet
    (True, {"a": DONE}, False),  # b unreported
    (True, None, False),  # nothing reported yet
])
def test_a_deleted_pod_has_stopped_once_every_container_is_reported_terminated(
        deleting: bool, states: dict[str, dict[str, Any]] | None, expected: bool) -> None:
    assert stopped(pod(deleting=deleting, states=states)) is expected
    assert not finished(pod(deleting=deleting, states=states))


def test_a_running_init_or_ephemeral_container_keeps_a_deleted_pod_going() -> None:
    both = {"a": DONE, "b": DONE}
    assert not stopped(pod(deleting=True, states=both, init=[{"name": "i", "state": RUNS}]))
    assert stopped(pod(deleting=True, states=both, init=[{"name": "i", "state": DONE}]))


@pytest.mark.parametrize("junk", [{}, {"metadata": "x"}, {"status": []},
                                  {"metadata": {"deletionTimestamp": "t"}, "spec": {},
                                   "status": {}},
                                  {"metadata": {"deletionTimestamp": "t"},
                                   "spec": {"containers": "x"}, "status": {}}])
def test_a_malformed_pod_is_never_taken_as_stopped(junk: dict[str, Any]) -> None:
    assert not stopped(junk) and not finished(junk)


def test_every_list_of_pods_that_may_hold_cards_leaves_out_the_terminal_phases_only() -> None:
    excluded = {term.removeprefix("status.phase!=") for term in NOT_TERMINAL_SELECTOR.split(",")}
    assert excluded == TERMINAL_PHASES == {"Succeeded", "Failed"}
    assert EXTENDER_PODS == TOP_PODS["fieldSelector"] == NOT_TERMINAL_SELECTOR
    assert node_selector("n1", finished=False) == f"spec.nodeName=n1,{NOT_TERMINAL_SELECTOR}"
