"""The MIG adapter controller's pure parts (core.mig): instances held, a bare pod's rule's next
step from what the API shows (crash safety), rule names, owner rules' garbage collection, the
controller's `mig:` config."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.controller.config import MigConfig, load_config
from elastic_gpu.core.mig.bare import BarePodState, BareStep, bare_rule_step, owner_rule_unused
from elastic_gpu.core.mig.rules import SubstitutionRule, parse_original, rule_name
from elastic_gpu.core.mig.substitution import (
    BoundPod,
    MoveBackPolicy,
    free_instances,
    held_instances,
    without,
)
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.resources import MigProfile

P = MigProfile.parse


def node(name: str, *profiles: str) -> Node:
    instances = tuple(MigInstance(P(p), f"MIG-{name}-{i}", i) for i, p in enumerate(profiles))
    return Node(name, 8000, 65536, (Card(0, f"GPU-{name}", "A100-SXM4-80GB", 81920,
                                         mig=instances),))


def test_held_instances_take_assignments_and_one_instance_per_unassigned_profile() -> None:
    nodes = [node("a", "1g.10gb", "1g.10gb", "2g.20gb")]
    held = held_instances(nodes, [BoundPod("a", ("MIG-a-0",)),
                                  BoundPod("a", (), (P("1g.10gb"),))])
    assert held == {"MIG-a-0", "MIG-a-1"}  # the unassigned pod gets the one not assigned
    free = free_instances(nodes, held)
    assert [i.uuid for i in free["a"]] == ["MIG-a-2"]
    # a pod asking a profile its node has no instance of left holds nothing more
    assert held_instances(nodes, [BoundPod("a", (), (P("2g.20gb"), P("2g.20gb")))]) == {"MIG-a-2"}
    assert held_instances(nodes, [BoundPod("gone", (), (P("1g.10gb"),))]) == set()
    assert [i.uuid for i in without(free_instances(nodes, set()), ["MIG-a-1"])["a"]] == [
        "MIG-a-0", "MIG-a-2"]


BARE = SubstitutionRule("r", "ns", P("1g.10gb"), P("2g.20gb"), pod_name="train",
                        saved_pod={"metadata": {"name": "train"}})
RETURNING = SubstitutionRule("r", "ns", P("1g.10gb"), P("2g.20gb"), pod_name="train",
                             saved_pod={"metadata": {"name": "train"}}, returning=True)


@pytest.mark.parametrize(("rule", "state", "step"), [
    # a move: rule written, pod deleted, not created (SIGKILL there): create it
    (BARE, BarePodState(exists=False), BareStep.CREATE),
    # ... and the deleted pod is still there, held by a finalizer (the budget keeper's): wait
    # for it to be gone, never judge it as if it stayed (the rule holds its only copy)
    (BARE, BarePodState(exists=True, terminating=True), BareStep.WAIT),
    (BARE, BarePodState(exists=True, pending=True, terminating=True), BareStep.WAIT),
    (RETURNING, BarePodState(exists=True, rewritten=True, recorded=True, terminating=True),
     BareStep.WAIT),
    # ... even marked Failed: kube-controller-manager's pod GC does that to a deleted pod that
    # was never scheduled while a finalizer holds it
    (BARE, BarePodState(exists=True, pending=False, finished=True, terminating=True),
     BareStep.WAIT),
    # a move that stopped before its delete: the pod still waits un-rewritten
    (BARE, BarePodState(exists=True, pending=True), BareStep.DELETE_POD),
    (BARE, BarePodState(exists=True, rewritten=True), BareStep.NONE),
    (BARE, BarePodState(exists=True, rewritten=True, recorded=True), BareStep.NONE),
    # the user deleted the moved pod: nothing refers to the rule
    (BARE, BarePodState(exists=False, recorded=True), BareStep.DELETE_RULE),
    (BARE, BarePodState(exists=True, rewritten=True, finished=True), BareStep.DELETE_RULE),
    # the pod got its own profile placed before the move went on
    (BARE, BarePodState(exists=True), BareStep.DELETE_RULE),
    # a return: rule marked, pod deleted, not created: create it (as written)
    (RETURNING, BarePodState(exists=False, recorded=True), BareStep.CREATE),
    (RETURNING, BarePodState(exists=True, rewritten=True, recorded=True), BareStep.DELETE_POD),
    (RETURNING, BarePodState(exists=True, recorded=True), BareStep.DELETE_RULE),
    (RETURNING, BarePodState(exists=True, rewritten=True, finished=True), BareStep.DELETE_RULE),
])
def test_a_bare_rules_next_step_comes_from_the_api_alone(
        rule: SubstitutionRule, state: BarePodState, step: BareStep) -> None:
    assert bare_rule_step(rule, state) is step


def test_a_returning_rule_selects_nothing() -> None:
    assert BARE.selects("ns", "train", [])
    assert not RETURNING.selects("ns", "train", [])


def test_rule_names_are_dns_names_unique_per_subject_and_profiles() -> None:
    a = rule_name("web-7d9f", P("1g.10gb"), P("2g.20gb"), "uid-1")
    assert a.startswith("web-7d9f-1g10gb-to-2g20gb-") and len(a) <= 63
    assert a != rule_name("web-7d9f", P("1g.10gb"), P("2g.20gb"), "uid-2")
    assert a != rule_name("web-7d9f", P("1g.10gb"), P("3g.40gb"), "uid-1")
    long = rule_name("x" * 200, P("1g.10gb+me"), P("2g.20gb"), "k")
    assert len(long) <= 63 and "+" not in long and long == long.lower()


def test_parse_original_reads_what_the_webhook_writes() -> None:
    assert parse_original("main=1g.10gb,side=2g.20gb") == {"main": P("1g.10gb"),
                                                            "side": P("2g.20gb")}
    assert parse_original("main=nonsense,x") == {}


def test_owner_rules_are_kept_while_referred_to_in_flight_or_young() -> None:
    assert owner_rule_unused(0, False, 31, 30)
    assert not owner_rule_unused(1, False, 31, 30)
    assert not owner_rule_unused(0, True, 31, 30)
    assert not owner_rule_unused(0, False, 5, 30)


def test_config_defaults_and_namespaces(tmp_path: Path) -> None:
    default = load_config(None).mig
    assert default.enabled and default.move_back is MoveBackPolicy.ALWAYS
    assert default.substitutions is None and default.governs("anything")
    path = tmp_path / "c.yaml"
    path.write_text("mig:\n  namespaces: [a, b]\n  excludeNamespaces: [b]\n  moveBack: never\n"
                    "  substitutions: {1g.10gb: [2g.20gb, 3g.40gb]}\n")
    mig = load_config(path).mig
    assert mig.governs("a") and not mig.governs("b") and not mig.governs("c")
    assert mig.move_back is MoveBackPolicy.NEVER
    assert mig.substitutions == {"1g.10gb": frozenset({"2g.20gb", "3g.40gb"})}
    assert not MigConfig(enabled=False).governs("a")
    path.write_text("mig: {ruleGraceSeconds: -1}")
    with pytest.raises(ConfigError,
                       match=r"mig.ruleGraceSeconds: got -1 \(an integer\): Input should be greater"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
