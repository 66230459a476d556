"""The filter and prioritize answers, byte for byte, on a fixed state (issue 39, "Cost per
pod"): the verbs' cheaper paths (explanations shared by nodes that fail alike, fit masks,
answer building) must not change one byte of what kube-scheduler reads.

`pinned/verbs_answers.json` was written by the code before those changes
(`EGPU_PIN_WRITE=1 pytest this file` writes it again, for a deliberate change of answers).
Two deliberate changes are read from it instead: prioritize leaves out the nodes scored 0
(`wire.host_priorities`), so a pinned prioritize answer is compared without its zeros; and
a filter answer with a node that fits gives no reasons (kube-scheduler reads them only when
none fits), so a pinned one is compared without them.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client import generate_latest

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.model import Card, Health, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.usage import CardUsage
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState

PINNED = Path(__file__).parent / "pinned" / "verbs_answers.json"
MODELS = (("A100-SXM4-80GB", 81920), ("T4", 16384), ("L4", 23034))


def nodes(rng: random.Random, count: int) -> list[Node]:
    """Nodes of three models and 1-8 cards, a few cards unhealthy or holding memory out of
    band, so that every node-level and card-level refusal occurs."""
    out = []
    for i in range(count):
        model, mib = rng.choice(MODELS)
        cards = tuple(
            Card(c, f"GPU-{i}-{c}", model, mib,
                 health=Health.HEALTHY if rng.random() > 0.06 else Health.UNHEALTHY,
                 usage=(CardUsage(mib // 2, mib // 3, 0) if rng.random() < 0.08 else None))
            for c in range(rng.choice((1, 2, 4, 8))))
        out.append(Node(f"n{i:03d}", rng.choice((32_000, 96_000)), 262_144, cards))
    return out


def pod(rng: random.Random, i: int) -> dict[str, Any]:
    """Shares, whole cards, TFLOPS shares, two GPU containers, model choices, CPU-only."""
    kind = rng.random()
    if kind < 0.4:
        limits = {"elasticgpu.io/gpu-core": str(rng.randrange(10, 100, 5)),
                  "elasticgpu.io/gpu-memory": str(rng.randrange(1, 40) * 1024)}
    elif kind < 0.75:
        limits = {"nvidia.com/gpu": str(rng.choice((1, 1, 2, 4, 8)))}
    elif kind < 0.85:
        limits = {"elasticgpu.io/gpu-tflops": str(rng.choice((20, 60, 400)))}
    elif kind < 0.95:
        limits = {"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "4096"}
    else:
        limits = {}
    manifest = pod_manifest(f"p{i}", uid=f"uid-p{i}", limits=limits)
    manifest["metadata"]["resourceVersion"] = "1"
    manifest["spec"]["containers"][0]["resources"].setdefault("requests", {})["cpu"] = \
        f"{100 + i}m"
    if 0.85 <= kind < 0.95:  # a second GPU container
        second = json.loads(json.dumps(manifest["spec"]["containers"][0]))
        second["name"] = "second"
        second["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "10m"}}
        manifest["spec"]["containers"].append(second)
    choice = rng.random()
    notes = manifest["metadata"].setdefault("annotations", {})
    if choice < 0.1:
        notes["elasticgpu.io/gpu-model"] = "T4"
    elif choice < 0.15:
        notes["elasticgpu.io/gpu-model-exclude"] = "A100-SXM4-80GB"
    return manifest


def answers() -> list[str]:
    """Filter then prioritize for 120 pods on 60 nodes (and a name no node has), each pod
    bound where the scores put it, as kube-scheduler would; then the unschedulable metric."""
    rng = random.Random(39)
    # pinned under `filterResult: all` (every fitting node; `auto` narrows a plain pod's)
    state = ready_state(nodes(rng, 60), SchedulerState(SchedulerConfig(filter_result="all")))
    extender = Extender(state)
    names = state.node_names()
    out: list[str] = []
    for i in range(120):
        manifest = pod(rng, i)
        asked = [*rng.sample(names, rng.choice((20, 60))), "nowhere"]
        body = msgspec.json.encode({"Pod": manifest, "Nodes": None, "NodeNames": asked})
        filtered = extender.filter(body).body
        assert isinstance(filtered, bytes)
        out.append(filtered.decode())
        feasible = msgspec.json.decode(filtered)["NodeNames"] or []
        scored = extender.prioritize(msgspec.json.encode(
            {"Pod": manifest, "Nodes": None, "NodeNames": [*feasible, "nowhere"]})).body
        assert isinstance(scored, bytes)
        out.append(scored.decode())
        scores = msgspec.json.decode(scored)
        scores = scores if isinstance(scores, list) else []  # an error: the pod is refused
        known = [h for h in scores if h["Host"] != "nowhere"]
        best = max(known, key=lambda h: (h["Score"], h["Host"]))["Host"] if known else None
        if best is not None and best in feasible and manifest["spec"]["containers"][0][
                "resources"]["limits"]:
            uid = manifest["metadata"]["uid"]
            token, done = state.reserve(pod_request_from_manifest(manifest), uid, best)
            state.settle(uid, token, "bound", with_binding(manifest, best, done))
    # the refusals' main reasons, as the unschedulable metric counted them
    metric = generate_latest(extender.metrics.registry).decode()
    out += sorted(line for line in metric.splitlines()
                  if line.startswith("elasticgpu_scheduler_unschedulable_total{"))
    return out


def test_filter_and_prioritize_answers_are_byte_identical_to_the_pinned_ones() -> None:
    got = answers()
    if os.environ.get("EGPU_PIN_WRITE"):
        PINNED.write_text(json.dumps(got, indent=0) + "\n")
    pinned = [without_zero_scores(a) if i % 2 else without_reasons_if_fit(a)
              for i, a in enumerate(json.loads(PINNED.read_text()))]
    assert len(got) == len(pinned)
    for i, (mine, theirs) in enumerate(zip(got, pinned, strict=True)):
        assert mine == theirs, f"answer {i}"


def without_zero_scores(answer: str) -> str:
    """A pinned prioritize answer as it is now: the entries scored 0 left out, the rest
    byte for byte (an error answer, or a metric line, as it was)."""
    decoded = json.loads(answer)
    if not isinstance(decoded, list):
        return answer
    return msgspec.json.encode([h for h in decoded if h["Score"]]).decode()


def without_reasons_if_fit(answer: str) -> str:
    """A pinned filter answer as it is now: with a node that fits, no failed node's reason."""
    if not answer.startswith("{"):
        return answer  # a metric line
    decoded = json.loads(answer)
    if not decoded.get("NodeNames"):
        return answer
    return msgspec.json.encode({**decoded, "FailedNodes": {},
                                "FailedAndUnresolvableNodes": {}}).decode()


def test_filter_gives_reasons_only_when_no_node_fits() -> None:
    """The change: the pinned answers of the code before hold reasons beside fitting nodes."""
    def mixed(answers: list[str]) -> int:
        return sum(1 for a in answers if (d := json.loads(a))["NodeNames"]
                   and (d["FailedNodes"] or d["FailedAndUnresolvableNodes"]))
    assert mixed(json.loads(PINNED.read_text())[0:240:2]) > 0
    got = answers()[0:240:2]
    assert mixed(got) == 0
    assert any(not json.loads(a)["NodeNames"] and json.loads(a)["FailedNodes"] for a in got)


def test_prioritize_lists_no_node_scored_0() -> None:
    """Leaving them out is the change: the pinned answers of the code before hold zeros."""
    pinned = json.loads(PINNED.read_text())
    assert any('"Score":0' in a for a in pinned[1:240:2])
    assert not any('"Score":0' in a for a in answers()[1:240:2])


def test_the_pinned_answers_cover_every_kind_of_refusal() -> None:
    text = "\n".join(json.loads(PINNED.read_text()))
    for words in ("no healthy gpu", "accepts", "entirely free", "compute and", "out of band",
                  "TFLOPS", "unknown", "no card has room"):
        assert words.lower() in text.lower(), words
