"""`filterResult: auto` (docs/scheduler.md, "One round trip per pod"): the engine's one node for
a pod kube-scheduler's scores would weigh nothing of, every fitting node for a pod that states a
soft preference or meets a PreferNoSchedule taint it does not tolerate."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import generate_latest

from egpu_testing.workbench import metric_value, pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.nodeaffinity import Taint, Toleration, rules_from_manifest, untolerated_taint
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.narrowing import (
    soft_preference,
    tolerations,
    wants_every_node,
)
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState

PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NAMES = ["n0", "n1", "n2", "n3"]
SOFT = Taint("dedicated", "batch", "PreferNoSchedule")


def pod(**spec: Any) -> dict[str, Any]:
    manifest = pod_manifest("p", uid="u", limits={"nvidia.com/gpu": "1"})
    manifest["spec"].update(spec)
    return manifest


def node_affinity(kind: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    if kind == PREFERRED:
        return {"nodeAffinity": {PREFERRED: [{"weight": 10, "preference": term}]}}
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [term]}}}


def pod_term(kind: str, soft: bool) -> dict[str, Any]:
    term = {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "x"}}}
    if soft:
        return {kind: {PREFERRED: [{"weight": 50, "podAffinityTerm": term}]}}
    return {kind: {REQUIRED: [term]}}


def spread(when: str) -> list[dict[str, Any]]:
    return [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": when,
             "labelSelector": {"matchLabels": {"app": "x"}}}]


@pytest.mark.parametrize(("spec", "stated"), [
    ({}, None),
    ({"affinity": node_affinity(PREFERRED)}, f"nodeAffinity.{PREFERRED}"),
    ({"affinity": node_affinity(REQUIRED)}, None),  # a filter, not a score
    ({"affinity": pod_term("podAffinity", True)}, f"podAffinity.{PREFERRED}"),
    ({"affinity": pod_term("podAffinity", False)}, None),
    ({"affinity": pod_term("podAntiAffinity", True)}, f"podAntiAffinity.{PREFERRED}"),
    ({"affinity": pod_term("podAntiAffinity", False)}, None),
    ({"topologySpreadConstraints": spread("ScheduleAnyway")},
     "topologySpreadConstraints (whenUnsatisfiable: ScheduleAnyway)"),
    ({"topologySpreadConstraints": spread("DoNotSchedule")}, None),
    ({"nodeSelector": {"zone": "a"}}, None),
    ({"affinity": {"nodeAffinity": {PREFERRED: []}}}, None),  # an empty list states nothing
])
def test_soft_preference_per_case(spec: dict[str, Any], stated: str | None) -> None:
    assert soft_preference(pod(**spec)) == stated
    # and the same through the wire, which keeps only that a soft term is stated
    args = wire.parse_args(json.dumps({"Pod": pod(**spec), "NodeNames": NAMES}).encode())
    assert soft_preference(args.Pod) == stated
    assert wants_every_node(args.Pod, NAMES, {}) == stated


@pytest.mark.parametrize(("tolerate", "untolerated"), [
    ([], SOFT),
    ([{"key": "dedicated", "operator": "Equal", "value": "batch",
       "effect": "PreferNoSchedule"}], None),
    ([{"key": "dedicated", "operator": "Exists"}], None),  # every effect of the key
    ([{"operator": "Exists"}], None),  # every taint
    ([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}], SOFT),
    ([{"key": "dedicated", "operator": "Equal", "value": "gpu"}], SOFT),
])
def test_a_prefer_no_schedule_taint_the_pod_does_not_tolerate(
        tolerate: list[dict[str, str]], untolerated: Taint | None) -> None:
    manifest = pod(tolerations=tolerate)
    taints = [Taint("other", "", "NoSchedule"), SOFT]
    assert untolerated_taint(tolerations(manifest), taints, ("PreferNoSchedule",)) == untolerated
    want = None if untolerated is None else \
        "a candidate node's taint dedicated=batch:PreferNoSchedule the pod does not tolerate"
    assert wants_every_node(manifest, NAMES, {"n2": (SOFT,)}) == want
    # only candidate nodes count, however the candidates and the tainted nodes compare in number
    assert wants_every_node(manifest, ["n0", "n1"], {"n2": (SOFT,)}) is None
    assert wants_every_node(manifest, ["n2"], {"n2": (SOFT,), "n5": (SOFT,), "n6": (SOFT,)}) \
        == want


def test_tolerations_are_read_as_the_filters_read_them() -> None:
    manifest = pod(tolerations=[{"key": "a", "effect": "PreferNoSchedule"},
                                {"operator": "Exists"}])
    assert tolerations(manifest) == (Toleration("a", "Equal", "", "PreferNoSchedule"),
                                     Toleration("", "Exists", "", ""))
    assert tolerations(manifest) == rules_from_manifest(manifest).tolerations


def test_a_pod_with_tolerations_not_of_the_api_shape_tolerates_nothing() -> None:
    manifest = pod(tolerations=[{"key": 5}, {"key": "dedicated", "operator": "Exists"}])
    assert tolerations(manifest) == ()
    # so an untolerated soft taint among its candidates leaves the weighing to kube-scheduler
    assert wants_every_node(manifest, NAMES, {"n2": (SOFT,)}) is not None


def test_config_accepts_auto_and_defaults_to_it() -> None:
    assert SchedulerConfig().filter_result == "auto"
    for value in ("auto", "all", "best"):
        assert SchedulerConfig.model_validate({"filterResult": value}).filter_result == value


# ---- the filter verb under each configuration ------------------------------------------------

NODES = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "A100", 16384)
                                              for c in range(2)))
         for i in range(4)]


def answer(mode: str, manifest: dict[str, Any], taints: dict[str, tuple[Taint, ...]] | None = None,
           counted: str | None = None) -> list[str]:
    """The filter's node names under `filterResult: mode`; `counted`: the labels of
    `elasticgpu_scheduler_filter_answers_total` this one filter must have counted."""
    config = SchedulerConfig.model_validate({"filterResult": mode})
    state = ready_state(NODES, SchedulerState(config))
    for name, tainted in (taints or {}).items():
        state.upsert_node(NodeInfo(name, 64_000, 256_000, {}, taints=tainted))
    extender = Extender(state)
    response = extender.filter(json.dumps({"Pod": manifest, "Nodes": None,
                                           "NodeNames": NAMES}).encode())
    assert response.text is not None
    names: list[str] = json.loads(response.text)["NodeNames"]
    if counted is not None:
        page = generate_latest(extender.metrics.registry).decode()
        assert metric_value(page, "elasticgpu_scheduler_filter_answers_total{}") == 1
        assert metric_value(page, f"elasticgpu_scheduler_filter_answers_total{{{counted}}}") == 1
    return names


def test_auto_answers_the_engines_one_node_for_a_plain_pod() -> None:
    (best,) = answer("best", pod(), counted='answer="one",because="configured"')
    assert answer("auto", pod(), counted='answer="one",because="none"') == [best]
    assert answer("all", pod(), counted='answer="every",because="configured"') == NAMES


@pytest.mark.parametrize("spec", [
    {"affinity": node_affinity(PREFERRED)},
    {"affinity": pod_term("podAntiAffinity", True)},
    {"topologySpreadConstraints": spread("ScheduleAnyway")},
])
def test_auto_answers_every_fitting_node_for_a_pod_with_a_soft_preference(
        spec: dict[str, Any]) -> None:
    assert answer("auto", pod(**spec), counted='answer="every",because="soft_preference"') \
        == NAMES
    assert len(answer("best", pod(**spec))) == 1  # best narrows whatever the pod says


def test_auto_answers_every_fitting_node_when_a_candidate_has_an_untolerated_soft_taint() -> None:
    assert answer("auto", pod(), {"n3": (SOFT,)},
                  counted='answer="every",because="prefer_no_schedule_taint"') == NAMES
    tolerant = pod(tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert len(answer("auto", tolerant, {"n3": (SOFT,)})) == 1
    # the inventory keeps the soft taints as nodes change
    state = ready_state(NODES, SchedulerState(SchedulerConfig()))
    state.upsert_node(NodeInfo("n3", 64_000, 256_000, {}, taints=(SOFT,)))
    assert state.prefer_no_schedule() == {"n3": (SOFT,)}
    state.upsert_node(NodeInfo("n3", 64_000, 256_000, {},
                               taints=(Taint("x", "", "NoSchedule"),)))
    assert state.prefer_no_schedule() == {}
    state.upsert_node(NodeInfo("n3", 64_000, 256_000, {}, taints=(SOFT,)))
    state.remove_node("n3")
    assert state.prefer_no_schedule() == {}
