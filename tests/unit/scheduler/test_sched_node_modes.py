"""The verbs ask each node's mode (`core.nodemode`): device-plugin nodes check the pod's claims
and then the engine, DRA nodes their own rule; every refusal is a typed fit failure named by
its check, made a sentence only in the answer."""

from __future__ import annotations

import json
from typing import Any

from egpu_testing.claims import claim_object, claim_pod, class_object, elasticgpu_object
from egpu_testing.workbench import ready_state
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.claims.blocks import BlockKind
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.app import Feeds
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState
from elastic_gpu.scheduler.verbs import DevicePluginMode

CORE = "elasticgpu.io/gpu-core"
HOW_TO_ASK = ("the node serves GPUs through DRA; ask for a share with a ResourceClaim of class "
              "gpu.elasticgpu.io (ElasticGPUClaims are served on device-plugin nodes only)")


def _state() -> tuple[SchedulerState, Feeds]:
    state = ready_state([Node(n, 64_000, 256_000, (Card(0, f"GPU-{n}-0", "T4", 16384),))
                         for n in ("n1", "n2")])
    for name in ("dra-a", "dra-b"):
        state.upsert_node(NodeInfo(name, 64_000, 256_000, {GPU_MODE_LABEL: "dra"}))
    feeds = Feeds(state)
    feeds.egpus_replace([])
    feeds.classes_replace([class_object("share")])
    feeds.claims_replace([claim_object("c1", {CORE: 40}, uid="u1")])
    return state, feeds


def _pod() -> dict[str, Any]:
    return claim_pod("p", {"main": "c1"}, resources={"main": {CORE: "40"}})


def _filter(ext: Extender, names: list[str]) -> dict[str, Any]:
    body = json.dumps({"Pod": _pod(), "NodeNames": names}).encode()
    return dict(json.loads(ext.filter(body).text))


def test_the_device_plugin_mode_refuses_for_an_unbound_claim_with_one_claims_failure() -> None:
    state, _ = _state()
    pod = _pod()
    result = DevicePluginMode(state).fit(pod_request_from_manifest(pod), "uid-p", ["n1", "n2"],
                                         {"main": "c1"})
    assert result.feasible == []
    one, two = result.failed["n1"], result.failed["n2"]
    assert one is two  # one sentence made for every node it refuses
    assert (one.kind, one.check) == (FitKind.CLAIM_BLOCKED, "claims")
    (block,) = one.claim_blocks  # typed: the sentence is made at the edge
    assert (block.kind, block.claim) == (BlockKind.NOT_PROVISIONED, "default/c1")
    assert describe(one).startswith("ElasticGPUClaim default/c1 is Pending: not bound yet")


def test_the_device_plugin_mode_refuses_other_nodes_than_a_bound_claims() -> None:
    state, feeds = _state()
    feeds.egpus_event("ADDED", elasticgpu_object(
        "egpu-u1", "n2", [CardShare(0, "GPU-n2-0", 400, 0)], claim=("default", "c1", "u1")))
    result = DevicePluginMode(state).fit(pod_request_from_manifest(_pod()), "uid-p",
                                         ["n1", "n2"], {"main": "c1"})
    assert result.feasible == ["n2"]
    assert result.failed["n1"].kind is FitKind.CLAIM_ON_OTHER_NODE
    assert (result.failed["n1"].container, result.failed["n1"].node) == ("main", "n2")


def test_claims_and_dra_refusals_are_unresolvable_sentences_and_counted_by_their_check() -> None:
    state, _ = _state()
    ext = Extender(state)
    body = _filter(ext, ["n1", "dra-a", "dra-b"])
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    unresolvable = body["FailedAndUnresolvableNodes"]
    assert unresolvable["dra-a"] == unresolvable["dra-b"] == HOW_TO_ASK
    assert unresolvable["n1"].startswith("ElasticGPUClaim default/c1 is Pending: not bound yet")
    # the reason most nodes failed on: two DRA nodes against one claim refusal
    assert ext.metrics.unschedulable.labels("dra")._value.get() == 1
    _filter(ext, ["n1", "n2", "dra-a"])
    assert ext.metrics.unschedulable.labels("claim")._value.get() == 1
