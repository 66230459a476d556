"""The extender's fast paths decide exactly what the slow ones did: vectorised binpack/spread
scores, array explanations of failed nodes, array rescaling, and `filterResult: best`, whose
single node must be the engine's own choice."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import yaml

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.core.fit import FitKind
from elastic_gpu.core.model import Card, Health, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, task_shape
from elastic_gpu.core.policies import node_policy
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig, load_config
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.schedconfig import kube_scheduler_config
from elastic_gpu.scheduler.state import SchedulerState
from elastic_gpu.scheduler.state.placement import rescale_scored
from elastic_gpu.scheduler.verbs import parse_pod

REPO = Path(__file__).resolve().parents[3]
MODELS = ("A100-SXM4-80GB", "T4")


def random_nodes(rng: random.Random, count: int) -> list[Node]:
    nodes = []
    for i in range(count):
        model = rng.choice(MODELS)
        cards = tuple(Card(c, f"GPU-{i}-{c}", model, 81920 if model.startswith("A100") else 16384,
                           health=Health.HEALTHY if rng.random() > 0.05 else Health.UNHEALTHY)
                      for c in range(rng.choice((1, 2, 4, 8))))
        nodes.append(Node(f"n{i:03d}", rng.choice((32_000, 96_000)), 262_144, cards))
    return nodes


def random_pod(rng: random.Random, i: int) -> dict[str, Any]:
    kind = rng.random()
    if kind < 0.6:
        limits = {"elasticgpu.io/gpu-core": str(rng.randrange(10, 100, 5)),
                  "elasticgpu.io/gpu-memory": str(rng.randrange(1, 20) * 1024)}
    else:
        limits = {"nvidia.com/gpu": str(rng.choice((1, 1, 2, 4)))}
    annotations = {"elasticgpu.io/gpu-model": "T4"} if rng.random() < 0.1 else {}
    pod = pod_manifest(f"p{i}", uid=f"uid-p{i}", limits=limits)
    pod["metadata"].setdefault("annotations", {}).update(annotations)
    return pod


def loaded_state(rng: random.Random, config: SchedulerConfig, count: int = 60,
                 pods: int = 60) -> SchedulerState:
    state = ready_state(random_nodes(rng, count), SchedulerState(config))
    names = state.node_names()
    for i in range(pods):
        pod = random_pod(rng, 10_000 + i)
        request = pod_request_from_manifest(pod)
        node = state.engine.best(request, names)
        if node is None:
            continue
        uid = pod["metadata"]["uid"]
        token, done = state.reserve(request, uid, node)
        state.settle(uid, token, "bound", with_binding(pod, node, done))
    return state


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_vectorised_classic_scores_equal_the_policy_per_node(policy: str) -> None:
    rng = random.Random(7)
    state = loaded_state(rng, SchedulerConfig())
    engine = state.engine
    rule = node_policy(policy)
    names = engine.nodes()
    compared = 0
    for i in range(40):
        request = pod_request_from_manifest(random_pod(rng, i))
        scored = engine.scored(request, names, policy)
        compared += len(scored.feasible)
        task = task_shape(request)
        expected = [rule.score(engine.ctx, task, engine.node_view(n)) for n in scored.feasible]
        assert scored.scores.tolist() == expected  # exact: the same IEEE operations
    assert compared > 500


def test_array_explanations_equal_the_card_plan() -> None:
    rng = random.Random(11)
    state = loaded_state(rng, SchedulerConfig(), pods=400)
    engine = state.engine
    binpack = engine._card_policy("binpack")
    explained = 0
    for i in range(60):
        request = pod_request_from_manifest(random_pod(rng, i))
        result = engine.filter(request, engine.nodes())
        for name, failure in result.failed.items():
            if failure.kind in (FitKind.NO_HEALTHY_GPU, FitKind.MODEL_NOT_ACCEPTED):
                continue  # node-level checks, made before any card is looked at
            plan = engine._plan(engine._layout.row_of[name], request, binpack)
            assert failure == plan
            explained += 1
    assert explained > 100


@pytest.mark.parametrize("policy", ["binpack", "spread", "dotprod", "fgd", "packing"])
def test_filter_best_returns_exactly_the_engine_choice(policy: str) -> None:
    rng = random.Random(3)
    state = loaded_state(rng, SchedulerConfig(nodePolicy=policy, filterResult="best"))
    names = state.node_names()
    placed = 0
    for i in range(60):
        pod = random_pod(rng, i)
        request = parse_pod(pod)
        result = state.filter(request, pod["metadata"]["uid"], names)
        try:
            expected = state.engine.place(request).node
        except Exception:
            expected = None
        if expected is None:
            assert result.feasible == [] and set(result.failed) == set(names)
            continue
        # all names asked: the one node passed is the one `place` (the simulator) chooses
        assert result.feasible == [expected]
        placed += 1
        # a subset (kube-scheduler's sample): the best-scoring node of that subset
        subset = rng.sample(names, 25)
        narrowed = state.filter(request, pod["metadata"]["uid"], subset).feasible
        scores = state.engine.score(request, subset)
        if scores:
            assert len(narrowed) == 1 and scores[narrowed[0]] == max(scores.values())
        else:
            assert narrowed == []
    assert placed > 30


def test_filter_best_over_http_passes_one_node_and_explains_when_none_fits() -> None:
    nodes = [Node(f"n{i}", 64_000, 256_000, (Card(0, f"GPU-{i}", "T4", 16384),))
             for i in range(20)]
    state = ready_state(nodes, SchedulerState(SchedulerConfig(filterResult="best")))
    ext = Extender(state)
    half = pod_manifest("a", uid="uid-a", limits={"elasticgpu.io/gpu-core": "50"})
    token, done = state.reserve(parse_pod(half), "uid-a", "n13")
    state.settle("uid-a", token, "bound", with_binding(half, "n13", done))
    names = [n.name for n in nodes]
    pod = pod_manifest("b", uid="uid-b", limits={"elasticgpu.io/gpu-core": "30"})
    body = msgspec.json.encode({"Pod": pod, "Nodes": None, "NodeNames": names})
    answer = json.loads(ext.filter(body).body)
    assert answer["NodeNames"] == ["n13"]  # binpack: the used card
    assert answer["FailedNodes"] == {} and answer["Error"] == ""
    too_big = pod_manifest("c", uid="uid-c", limits={"elasticgpu.io/gpu-core": "400"})
    body = msgspec.json.encode({"Pod": too_big, "Nodes": None, "NodeNames": names})
    answer = json.loads(ext.filter(body).body)
    assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == set(names)
    # prioritize still answers for configurations that keep the verb
    body = msgspec.json.encode({"Pod": pod, "Nodes": None, "NodeNames": ["n13", "n2"]})
    assert json.loads(Extender(state).prioritize(body).body) == [
        {"Host": "n13", "Score": 10}]  # n2 scores 0: left out


def rescale(raw: dict[str, float], node_names: list[str]) -> dict[str, int]:
    """The arithmetic `rescale_scored` does on arrays, node by node: the oracle."""
    out = dict.fromkeys(node_names, 0)
    if not raw:
        return out
    low, high = min(raw.values()), max(raw.values())
    if high - low <= 0:
        return {**out, **dict.fromkeys(raw, 10)}
    scale = 10.0 / (high - low)
    return {**out, **{name: int((value - low) * scale + 0.5) for name, value in raw.items()}}


def test_rescale_on_arrays_equals_rescale_node_by_node() -> None:
    rng = random.Random(5)
    engine = Engine(random_nodes(rng, 30), PolicyConfig(check_host_resources=False))
    names = [*engine.nodes(), "ghost"]
    for i in range(30):
        request: PodRequest = pod_request_from_manifest(random_pod(rng, i))
        scored = engine.scored(request, names)
        assert rescale_scored(scored, names) == rescale(scored.as_dict(), names)
    flat = engine.scored(pod_request_from_manifest(random_pod(rng, 99)), names[:1])
    assert rescale_scored(flat, names[:1]) == rescale(flat.as_dict(), names[:1])


def test_fit_mask_memo_sees_every_allocation() -> None:
    engine = Engine([Node("a", 8000, 8192, (Card(0, "GPU-a", "T4", 16384),))])
    request = pod_request_from_manifest(
        pod_manifest("p", uid="u", limits={"elasticgpu.io/gpu-core": "60"}))
    assert engine.scored(request, ["a"]).feasible == ["a"]
    engine.allocate("other", engine.assign(request, "a"))
    assert engine.scored(request, ["a"]).failed == ["a"]
    engine.release("other")
    assert engine.best(request, ["a", "zz"]) == "a"


def test_filter_result_option_and_its_kube_scheduler_configuration(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("filterResult: best\n")
    assert load_config(path).filter_result == "best"
    path.write_text("filterResult: some\n")
    with pytest.raises(ConfigError, match="filter"):
        load_config(path)
    (extender,) = kube_scheduler_config(prioritize=False)["extenders"]
    assert "prioritizeVerb" not in extender and extender["filterVerb"] == "filter"
    assert extender["bindVerb"] == "bind" and extender["nodeCacheCapable"] is True
    deployed = yaml.safe_load((REPO / "deploy/scheduler/kube-scheduler-config-best.yaml").read_text())
    assert deployed == kube_scheduler_config(prioritize=False)
    config = yaml.safe_load((REPO / "deploy/scheduler/scheduler-best.yaml").read_text())
    assert SchedulerConfig.model_validate(config).filter_result == "best"


def test_scores_are_floats_in_an_array() -> None:
    engine = Engine([Node("a", 8000, 8192, (Card(0, "GPU-a", "T4", 16384),))])
    request = pod_request_from_manifest(
        pod_manifest("p", uid="u", limits={"elasticgpu.io/gpu-core": "10"}))
    scored = engine.scored(request, ["a", "b"])
    assert scored.scores.dtype == np.float64 and scored.failed == ["b"]


def test_a_filter_past_the_detail_limit_explains_nothing_when_a_node_fits() -> None:
    """The HTTP filter asks no reasons when a node fits (kube-scheduler reads them only when
    none fits): past `DETAIL_LIMIT` nodes the engine then explains no failed node; when none
    fits, or when reasons are asked, they are as before."""
    nodes = [Node(f"n{i:02d}", 64_000, 262_144,
                  tuple(Card(c, f"GPU-{i}-{c}", "A100-SXM4-80GB" if i < 3 else "T4", 16384)
                        for c in range(2))) for i in range(40)]
    state = ready_state(nodes)
    names = state.node_names()
    pod = pod_request_from_manifest(pod_manifest(
        "p", uid="uid-p", limits={"nvidia.com/gpu": "1"},
        annotations={"elasticgpu.io/gpu-model": "A100-SXM4-80GB"}))
    quiet = state.filter(pod, "uid-p", names, reasons_if_fit=False)
    assert quiet.feasible == ["n00", "n01", "n02"] and dict(quiet.failed) == {}
    told = state.filter(pod, "uid-p", names)
    assert told.feasible == quiet.feasible and len(told.failed) == 37
    none_fit = state.filter(pod, "uid-p", names[3:], reasons_if_fit=False)
    assert none_fit.feasible == [] and len(none_fit.failed) == 37
