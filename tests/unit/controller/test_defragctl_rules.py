"""The defragmentation controller's pure rules (core.defrag.movable, core.defrag.limits) and
its configuration (controller/config.py, `defrag:`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.controller.config import DefragMode, load_config
from elastic_gpu.core.defrag.limits import Eviction, RateLimits, over_limit, recent
from elastic_gpu.core.defrag.movable import (
    Memory,
    MoveRules,
    NotMovable,
    Owner,
    pod_facts,
    waiting_for_capacity,
    why_not_movable,
)

NO_MEMORY = Memory({}, {})
DEFAULT_RULES = MoveRules()


def pod(name: str = "p", *, namespace: str = "ml", owner: str | None = "ReplicaSet",
        label: str | None = "true", priority: int | None = None, node: str = "n1",
        deleting: bool = False, conditions: list[dict[str, Any]] | None = None,
        phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [
            {"kind": "Node", "name": "x", "uid": "not-controller"},
            {"kind": owner, "name": f"{name}-owner", "uid": f"owner-{name}", "controller": True}]
    if label is not None:
        meta["labels"] = {"elasticgpu.io/movable": label}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T20:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "main"}]}
    if priority is not None:
        spec["priority"] = priority
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if conditions is not None:
        status["conditions"] = conditions
    return {"metadata": meta, "spec": spec, "status": status}


def why(obj: dict[str, Any], *, pending_priority: int = 0, rules: MoveRules = DEFAULT_RULES,
        memory: Memory = NO_MEMORY, now: float = 1000.0, holds_cards: bool = True,
        uses_claim: bool = False) -> NotMovable | None:
    return why_not_movable(pod_facts(obj), holds_cards=holds_cards, uses_claim=uses_claim,
                           pending_priority=pending_priority, rules=rules, memory=memory,
                           now=now)


def test_pod_facts_reads_the_controller_owner_and_tolerates_missing_fields() -> None:
    facts = pod_facts(pod(priority=7))
    assert facts.owner == Owner("ReplicaSet", "p-owner", "owner-p")
    assert (facts.key, facts.priority, facts.node, facts.movable_label) == ("ml/p", 7, "n1", "true")
    bare = pod_facts({})
    assert bare.owner is None and bare.priority == 0 and bare.node == "" and not bare.deleting
    assert pod_facts({"spec": {"priority": True}}).priority == 0  # a bool is no priority


@pytest.mark.parametrize("owner", ["ReplicaSet", "StatefulSet", "Job"])
def test_an_opted_in_pod_of_a_recreating_owner_may_move(owner: str) -> None:
    assert why(pod(owner=owner)) is None


def test_a_bare_pod_never_moves_whatever_its_label_or_namespace() -> None:
    rules = MoveRules(movable_namespaces=frozenset({"ml"}))
    assert why(pod(owner=None), rules=rules) is NotMovable.BARE
    assert why(pod(owner="DaemonSet")) is NotMovable.OWNER_KIND
    assert why(pod(owner="Node")) is NotMovable.OWNER_KIND


def test_opting_in_by_label_or_namespace_and_out_by_label() -> None:
    assert why(pod(label=None)) is NotMovable.NOT_OPTED_IN
    assert why(pod(label="yes")) is NotMovable.NOT_OPTED_IN  # only "true" opts in
    batch = MoveRules(movable_namespaces=frozenset({"ml"}))
    assert why(pod(label=None), rules=batch) is None
    assert why(pod(label=None, namespace="other"), rules=batch) is NotMovable.NOT_OPTED_IN
    assert why(pod(label="false"), rules=batch) is NotMovable.OPTED_OUT


def test_never_a_pod_of_higher_priority_than_the_pending_one() -> None:
    assert why(pod(priority=10), pending_priority=9) is NotMovable.HIGHER_PRIORITY
    assert why(pod(priority=10), pending_priority=10) is None
    assert why(pod(priority=-5), pending_priority=0) is None


def test_cool_down_is_per_owner_and_a_refusal_per_pod() -> None:
    rules = MoveRules(cool_down_s=600)
    moved = Memory({"owner-p": 500.0}, {})
    assert why(pod(), rules=rules, memory=moved, now=1099.0) is NotMovable.COOLING_DOWN
    assert why(pod(), rules=rules, memory=moved, now=1100.0) is None
    # the replacement pod (another name, the same owner uid) cools down too
    other = pod("p2")
    other["metadata"]["ownerReferences"][1]["uid"] = "owner-p"
    assert why(other, rules=rules, memory=moved, now=1000.0) is NotMovable.COOLING_DOWN
    refused = Memory({}, {"uid-p": 900.0})
    assert why(pod(), rules=rules, memory=refused, now=1000.0) is NotMovable.REFUSED
    assert why(pod("q"), rules=rules, memory=refused, now=1000.0) is None


def test_only_placed_pods_of_their_own_cards_move() -> None:
    assert why(pod(node="")) is NotMovable.NOT_PLACED
    assert why(pod(deleting=True)) is NotMovable.NOT_PLACED
    assert why(pod(), holds_cards=False) is NotMovable.NOT_PLACED
    assert why(pod(), uses_claim=True) is NotMovable.CLAIM


UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


def test_waiting_for_capacity_is_kube_schedulers_unschedulable_on_an_unbound_pod() -> None:
    assert waiting_for_capacity(pod(node="", phase="Pending", conditions=UNSCHEDULABLE))
    assert not waiting_for_capacity(pod(node="n1", phase="Pending", conditions=UNSCHEDULABLE))
    assert not waiting_for_capacity(pod(node="", phase="Pending", conditions=[]))
    assert not waiting_for_capacity(pod(node="", phase="Pending"))
    assert not waiting_for_capacity(pod(node="", phase="Pending", deleting=True,
                                        conditions=UNSCHEDULABLE))
    assert not waiting_for_capacity(pod(node="", phase="Failed", conditions=UNSCHEDULABLE))
    gated = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    assert not waiting_for_capacity(pod(node="", phase="Pending", conditions=gated))


def test_rate_limits_count_the_window_and_the_plan_together() -> None:
    limits = RateLimits(per_node=2, cluster=4, window_s=100)
    history = [Eviction(0.0, "n1"), Eviction(50.0, "n1"), Eviction(60.0, "n2")]
    assert recent(history, 120.0, limits) == history[1:]
    # at 120 s: n1 has 1 in the window, the cluster 2
    assert over_limit(["n1"], history, 120.0, limits) is None
    assert "per-node limit of 2" in str(over_limit(["n1", "n1"], history, 120.0, limits))
    assert "cluster limit of 4" in str(over_limit(["n3", "n4", "n5"], history, 120.0, limits))
    assert over_limit(["n3", "n4", "n5"], history, 155.0, limits) is None  # 50 s left the window
    assert over_limit([], [], 0.0, limits) is None


def test_defrag_config_is_off_by_default_and_strict(tmp_path: Path) -> None:
    default = load_config(None).defrag
    assert not default.enabled and default.mode is DefragMode.REPORT
    assert not default.governs("anything")
    path = tmp_path / "c.yaml"
    path.write_text("defrag:\n  enabled: true\n  mode: move\n  namespaces: [a]\n"
                    "  movableNamespaces: [batch]\n  maxMoves: 4\n  coolDownSeconds: 60\n"
                    "  maxMovesPerNode: 1\n  maxMovesCluster: 3\n  rateWindowSeconds: 30\n"
                    "  settleSeconds: 20\n  policy: binpack\n")
    cfg = load_config(path).defrag
    assert cfg.governs("a") and not cfg.governs("b") and cfg.mode is DefragMode.MOVE
    assert cfg.movable_namespaces == frozenset({"batch"}) and cfg.max_moves == 4
    assert (cfg.cool_down_s, cfg.max_moves_per_node, cfg.max_moves_cluster) == (60, 1, 3)
    assert (cfg.rate_window_s, cfg.settle_s, cfg.policy) == (30, 20, "binpack")
    path.write_text("defrag: {enabled: true}\n")
    assert load_config(path).defrag.governs("any")
    for bad, match in (("defrag: {enabled: 'yes'}", "defrag.enabled"),
                       ("defrag: {mode: evict}", "defrag.mode"),
                       ("defrag: {maxMoves: 0}", "defrag.maxMoves"),
                       ("defrag: {policy: nope}", "no node policy"),
                       ("defrag: {movableNamespaces: batch}", "list of namespace names"),
                       ("defrag: {maxMovesPerNod: 1}", "maxMovesPerNod")):
        path.write_text(bad + "\n")
        with pytest.raises(ConfigError, match=match):
            load_config(path)
