"""The MIG table against NVIDIA's published sizes, and the adapter's pure decisions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from elastic_gpu.core.mig.profiles import MIG_MODELS, compatible, mig_model
from elastic_gpu.core.mig.rules import SubstitutionRule, recreated_pod, saved_pod
from elastic_gpu.core.mig.substitution import (
    Constraints,
    FreeInstance,
    MoveBackPolicy,
    MovedPod,
    NoSubstitute,
    PendingPod,
    choose_substitute,
    constraints_for,
    free_instances,
    mig_request,
    move_back,
    plan_substitutions,
    restart_safe,
)
from elastic_gpu.core.model import Card, Health, MigInstance, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.scheduler.schedconfig import MIG_PROFILES

P = MigProfile.parse

# NVIDIA MIG user guide, "Supported MIG Profiles": name -> (memory slices, instances per card).
PUBLISHED = {
    "A30-24GB": {"1g.6gb": (1, 4), "1g.6gb+me": (1, 1), "2g.12gb": (2, 2),
                 "2g.12gb+me": (2, 1), "4g.24gb": (4, 1)},
    "A100-SXM4-40GB": {"1g.5gb": (1, 7), "1g.5gb+me": (1, 1), "1g.10gb": (2, 4),
                       "2g.10gb": (2, 3), "3g.20gb": (4, 2), "4g.20gb": (4, 1),
                       "7g.40gb": (8, 1)},
    "A100-80GB": {"1g.10gb": (1, 7), "1g.10gb+me": (1, 1), "1g.20gb": (2, 4),
                  "2g.20gb": (2, 3), "3g.40gb": (4, 2), "4g.40gb": (4, 1), "7g.80gb": (8, 1)},
    "H100-80GB": {"1g.10gb": (1, 7), "1g.10gb+me": (1, 1), "1g.20gb": (2, 4),
                  "2g.20gb": (2, 3), "3g.40gb": (4, 2), "4g.40gb": (4, 1), "7g.80gb": (8, 1)},
    "H200-141GB": {"1g.18gb": (1, 7), "1g.18gb+me": (1, 1), "1g.35gb": (2, 4),
                   "2g.35gb": (2, 3), "3g.71gb": (4, 2), "4g.71gb": (4, 1),
                   "7g.141gb": (8, 1)},
}
FAMILY = {"A30-24GB": "A30", "A100-SXM4-40GB": "A100", "A100-80GB": "A100", "H100-80GB": "H100",
          "H200-141GB": "H200"}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_every_profile_of_each_model_has_its_published_size(model: str) -> None:
    card = mig_model(model)
    assert card is not None and card.family == FAMILY[model]
    assert {r.profile.name for r in card.profiles} == set(PUBLISHED[model])
    for row in card.profiles:
        memory_slices, instances = PUBLISHED[model][row.profile.name]
        assert (row.memory_slices, row.max_instances) == (memory_slices, instances)
        assert row.compute_slices == row.profile.slices <= card.compute_slices
        # the name's memory is the fraction of the card's memory, rounded as NVIDIA rounds it
        assert abs(row.memory_gb - card.memory_gb * memory_slices / card.memory_slices) <= 2.5
        # every instance of one profile fits the card's slices at once
        assert instances * row.compute_slices <= card.compute_slices or instances == 1


def test_card_names_as_nodes_and_nvml_write_them() -> None:
    cases = {"NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB", "NVIDIA A100-PCIE-80GB": "A100-80GB",
             "A100-SXM4-80GB": "A100-80GB", "NVIDIA H100 80GB HBM3": "H100-80GB",
             "NVIDIA H200": "H200-141GB", "NVIDIA A30": "A30-24GB"}
    for written, name in cases.items():
        found = mig_model(written)
        assert found is not None and found.name == name, written
    assert mig_model("Tesla T4") is None
    assert mig_model("NVIDIA H100 NVL 94GB") is None  # not in the table: never substituted on


def test_scheduler_managed_names_are_the_table() -> None:
    # every profile of the table (the `+me` variants are not the scheduler's to manage)
    assert set(MIG_PROFILES) == {row.profile.name for model in MIG_MODELS
                                 for row in model.profiles if not row.profile.extra}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_compatible_is_at_least_the_slices_and_memory_within_the_model(model: str) -> None:
    rows = {r.profile: r for r in next(m for m in MIG_MODELS if m.name == model).profiles}
    for want in rows:
        for have in rows:
            expected = (want != have and have.slices >= want.slices
                        and have.memory_gb >= want.memory_gb
                        and (not want.extra or want.extra == have.extra))
            assert compatible(want, have, model) is expected, (want.name, have.name)


def test_the_issue_scenario_and_the_family_rule() -> None:
    assert compatible(P("1g.10gb"), P("2g.20gb"), "A100-SXM4-80GB")
    assert not compatible(P("2g.20gb"), P("1g.10gb"), "A100-SXM4-80GB")  # smaller
    assert not compatible(P("1g.20gb"), P("2g.10gb"), "A100-SXM4-40GB")  # less memory
    assert not compatible(P("2g.10gb"), P("2g.10gb"), "A100-SXM4-40GB")  # no substitution
    # A100 40 GB and 80 GB are one family: a 40 GB name may land on an 80 GB card
    assert compatible(P("1g.5gb"), P("1g.10gb"), "A100-80GB")
    # never across families, whatever the sizes
    assert not compatible(P("1g.10gb"), P("2g.35gb"), "H200-141GB")
    assert not compatible(P("1g.18gb"), P("7g.80gb"), "H100-80GB")
    assert not compatible(P("1g.6gb"), P("2g.20gb"), "A100-80GB")
    assert not compatible(P("1g.5gb"), P("2g.20gb"), "H100-80GB")
    # a profile the card does not have, or a card the table does not know
    assert not compatible(P("1g.10gb"), P("2g.10gb"), "A100-80GB")
    assert not compatible(P("1g.10gb"), P("2g.20gb"), "Tesla T4")
    # media extensions: a +me request needs them; a plain one may take them
    assert compatible(P("1g.10gb"), P("1g.10gb+me"), "H100-80GB")
    assert not compatible(P("1g.10gb+me"), P("2g.20gb"), "H100-80GB")


def inst(node: str, profile: str, card: str = "c0", model: str = "A100-SXM4-80GB",
         uuid: str = "") -> FreeInstance:
    return FreeInstance(node, card, model, P(profile), uuid or f"{node}-{card}-{profile}")


def by_node(*instances: FreeInstance) -> dict[str, list[FreeInstance]]:
    out: dict[str, list[FreeInstance]] = {}
    for i in instances:
        out.setdefault(i.node, []).append(i)
    return out


def test_the_smallest_compatible_profile_is_chosen() -> None:
    free = by_node(inst("a", "7g.80gb"), inst("b", "3g.40gb"), inst("b", "2g.20gb", "c1"),
                   inst("c", "1g.20gb"))
    got = choose_substitute(P("1g.10gb"), free)
    assert got.instance == inst("c", "1g.20gb")
    got = choose_substitute(P("2g.10gb"), free)  # 1g.20gb has too few slices
    assert got.instance == inst("b", "2g.20gb", "c1")
    # a plain profile before its +me twin of the same size
    free = by_node(inst("a", "1g.10gb+me"), inst("b", "1g.10gb+me"), inst("b", "1g.10gb", "c1"))
    assert choose_substitute(P("1g.5gb"), free).instance == inst("b", "1g.10gb", "c1")


def test_ties_go_where_they_fragment_least() -> None:
    # the same profile free on an untouched card and on a card already mostly used: best fit
    # takes the used card's, so the whole card stays free for a 7g request
    free = by_node(inst("a", "2g.20gb", "c0"), inst("a", "2g.20gb", "c0", uuid="x"),
                   inst("a", "3g.40gb", "c0"), inst("b", "2g.20gb", "c9"))
    assert choose_substitute(P("1g.10gb"), free).instance == inst("b", "2g.20gb", "c9")
    # order of the input does not matter
    reordered = {k: list(reversed(v)) for k, v in reversed(list(free.items()))}
    assert choose_substitute(P("1g.10gb"), reordered).instance == inst("b", "2g.20gb", "c9")
    # equal sizes on two models of one family: take from the profile with more free instances
    free = by_node(inst("a", "1g.10gb", model="A100-SXM4-40GB"),
                   inst("b", "1g.10gb", model="A100-80GB"),
                   inst("c", "1g.10gb", model="A100-80GB"))
    assert choose_substitute(P("1g.5gb"), free).instance.model == "A100-80GB"  # type: ignore[union-attr]


def test_constraints_are_honoured() -> None:
    free = by_node(inst("a", "2g.20gb"), inst("b", "3g.40gb"),
                   inst("h", "2g.20gb", model="H100-80GB"))
    assert choose_substitute(P("1g.10gb"), free, Constraints(nodes=frozenset({"b"}))
                             ).instance == inst("b", "3g.40gb")
    got = choose_substitute(P("1g.10gb"), free, Constraints(models=frozenset({"H100-80GB"})))
    assert got.instance == inst("h", "2g.20gb", model="H100-80GB")
    # models match exactly, as the scheduler matches them: a family name is no model
    got = choose_substitute(P("1g.10gb"), free, Constraints(models=frozenset({"H100"})))
    assert got.instance is None
    got = choose_substitute(P("1g.10gb"), free,
                            Constraints(denied_models=frozenset({"A100-SXM4-80GB"})))
    assert got.instance == inst("h", "2g.20gb", model="H100-80GB")
    # the configuration may allow fewer substitutions than the rule
    got = choose_substitute(P("1g.10gb"), free,
                            Constraints(allowed={"1g.10gb": frozenset({"3g.40gb"})}))
    assert got.instance == inst("b", "3g.40gb")
    got = choose_substitute(P("1g.10gb"), free, Constraints(allowed={}))
    assert got.instance is None and got.reason is NoSubstitute.NONE_COMPATIBLE


def test_nothing_moves_without_a_compatible_instance_or_when_the_asked_one_is_free() -> None:
    got = choose_substitute(P("3g.40gb"), by_node(inst("a", "2g.20gb"), inst("b", "1g.10gb")))
    assert got.instance is None and got.reason is NoSubstitute.NONE_COMPATIBLE
    assert "3g.40gb" in got.message and "3 compute slices" in got.message
    got = choose_substitute(P("1g.10gb"), by_node(inst("a", "2g.20gb"), inst("b", "1g.10gb")))
    assert got.instance is None and got.reason is NoSubstitute.REQUESTED_FREE
    assert "node b" in got.message
    # ... unless it is free only where the pod may not run
    got = choose_substitute(P("1g.10gb"), by_node(inst("a", "2g.20gb"), inst("b", "1g.10gb")),
                            Constraints(nodes=frozenset({"a"})))
    assert got.instance == inst("a", "2g.20gb")


def test_two_pending_pods_one_free_instance_exactly_one_moves() -> None:
    pods = [PendingPod("ns/p1", P("1g.10gb")), PendingPod("ns/p2", P("1g.10gb"))]
    plan = plan_substitutions(pods, by_node(inst("a", "2g.20gb")))
    assert plan["ns/p1"].instance == inst("a", "2g.20gb")
    assert plan["ns/p2"].instance is None
    assert plan["ns/p2"].reason is NoSubstitute.NONE_COMPATIBLE
    plan = plan_substitutions(pods, by_node(inst("a", "2g.20gb"), inst("b", "3g.40gb")))
    assert {plan[p.key].instance.node for p in pods} == {"a", "b"}  # type: ignore[union-attr]


# --- moving back ---------------------------------------------------------------------------


def moved(key: str, node: str = "a", owner: str | None = "ReplicaSet", restart: str = "Always",
          idle: bool | None = None, original: str = "1g.10gb") -> MovedPod:
    return MovedPod(key, P(original), P("2g.20gb"), node, owner, restart, idle)


def test_restart_safety() -> None:
    assert restart_safe(moved("p", owner="ReplicaSet"))
    assert restart_safe(moved("p", owner="Job", restart="Never"))
    assert restart_safe(moved("p", owner="StatefulSet"))
    assert not restart_safe(moved("p", owner="DaemonSet"))
    assert restart_safe(moved("p", owner=None, restart="Always"))
    assert not restart_safe(moved("p", owner=None, restart="Never"))
    assert not restart_safe(moved("p", owner=None, restart="OnFailure"))


def test_move_back_policy() -> None:
    pods = [moved("p1", idle=False), moved("p2", node="b", idle=True)]
    free = [inst("a", "1g.10gb"), inst("b", "1g.10gb")]
    assert move_back(pods, free, MoveBackPolicy.NEVER) == []
    got = move_back(pods, free, MoveBackPolicy.ALWAYS)
    assert [(m.pod.key, m.instance.node) for m in got] == [("p1", "a"), ("p2", "b")]
    got = move_back(pods, free, MoveBackPolicy.WHEN_IDLE)
    assert [m.pod.key for m in got] == ["p2"]
    # idleness not known counts as busy
    assert move_back([moved("p3")], free, MoveBackPolicy.WHEN_IDLE) == []


def test_move_back_only_where_safe_one_per_node_never_more_than_free() -> None:
    free = [inst("a", "1g.10gb"), inst("a", "1g.10gb", "c1")]
    pods = [moved("bare-never", owner=None, restart="Never"), moved("p1"), moved("p2"),
            moved("p3", node="b")]
    got = move_back(pods, free, MoveBackPolicy.ALWAYS)
    # the unsafe bare pod stays; p1 goes back on its node; p2 waits (one at a time on a);
    # p3 would arrive on a, which already has a move this round
    assert [m.pod.key for m in got] == ["p1"]
    # a node with a move in flight is not touched
    assert move_back(pods, free, MoveBackPolicy.ALWAYS, busy_nodes=frozenset({"a"})) == []
    # two free originals on two nodes, three pods: two go back
    free = [inst("a", "1g.10gb"), inst("b", "1g.10gb")]
    pods = [moved("p1"), moved("p2", node="b"), moved("p3", node="c")]
    got = move_back(pods, free, MoveBackPolicy.ALWAYS)
    assert [m.pod.key for m in got] == ["p1", "p2"]
    # a free instance of another profile, or on a node it may not use, is no way back
    assert move_back([moved("p1")], [inst("a", "1g.20gb")], MoveBackPolicy.ALWAYS) == []
    pod = MovedPod("p", P("1g.10gb"), P("2g.20gb"), "a", "ReplicaSet", "Always", None,
                   Constraints(nodes=frozenset({"a"})))
    assert move_back([pod], [inst("b", "1g.10gb")], MoveBackPolicy.ALWAYS) == []


def test_a_pods_movable_request_and_constraints_are_read_as_the_scheduler_reads_them() -> None:
    def pod(containers: dict[str, dict[str, str]], annotations: dict[str, str] | None = None
            ) -> Any:
        return pod_request_from_manifest({
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"containers": [{"name": n, "resources": {"limits": r}}
                                    for n, r in containers.items()]}})

    one = pod({"main": {"nvidia.com/mig-1g.10gb": "1"}, "side": {"cpu": "1"}},
              {"elasticgpu.io/gpu-model": "A100-SXM4-80GB|H100-80GB",
               "elasticgpu.io/gpu-model-deny": "H100-80GB"})
    assert mig_request(one) == P("1g.10gb")
    c = constraints_for(one, frozenset({"a"}))
    assert c.models == frozenset({"A100-SXM4-80GB", "H100-80GB"})
    assert c.denied_models == frozenset({"H100-80GB"}) and c.nodes == frozenset({"a"})
    assert mig_request(pod({"main": {"nvidia.com/mig-1g.10gb": "2"}})) is None
    assert mig_request(pod({"a": {"nvidia.com/mig-1g.10gb": "1"},
                            "b": {"nvidia.com/mig-1g.10gb": "1"}})) is None
    assert mig_request(pod({"main": {"nvidia.com/gpu": "1"}})) is None


def test_free_instances_are_the_healthy_ones_no_pod_holds() -> None:
    def card(index: int, *instances: tuple[str, str], health: Health = Health.HEALTHY) -> Card:
        return Card(index, f"GPU-{index}", "A100-SXM4-80GB", 81920, health=health,
                    mig=tuple(MigInstance(P(p), u, 0) for p, u in instances))

    sick = MigInstance(P("1g.10gb"), "MIG-sick", 6, Health.UNHEALTHY)
    nodes = [Node("a", 1000, 1024, (card(0, ("1g.10gb", "MIG-1"), ("2g.20gb", "MIG-2")),
                                     replace(card(1), mig=(sick,)))),
             Node("b", 1000, 1024, (card(0, ("3g.40gb", "MIG-3"), health=Health.UNHEALTHY),)),
             Node("c", 1000, 1024, ())]
    got = free_instances(nodes, held=["MIG-1"])
    assert got == {"a": [FreeInstance("a", "GPU-0", "A100-SXM4-80GB", P("2g.20gb"), "MIG-2")]}


def test_a_bare_pod_is_saved_and_recreated_with_everything_the_user_wrote() -> None:
    live = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train-0", "namespace": "team", "uid": "u1",
                         "resourceVersion": "42", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": [{"manager": "kubectl"}],
                         "labels": {"app": "train"},
                         "annotations": {"note": "mine", "elasticgpu.io/assignment": "{}"}},
            "spec": {"nodeName": "a", "restartPolicy": "Always",
                     "containers": [{"name": "main", "image": "x", "args": ["--epochs", "3"],
                                     "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]},
            "status": {"phase": "Running"}}
    saved = saved_pod(live)
    assert "status" not in saved and "nodeName" not in saved["spec"]
    assert set(saved["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert live["metadata"]["uid"] == "u1" and live["spec"]["nodeName"] == "a"  # not mutated
    rule = SubstitutionRule("bare", "team", P("1g.10gb"), P("2g.20gb"), pod_name="train-0",
                            saved_pod=saved)
    again = recreated_pod(rule, ["elasticgpu.io/assignment"])
    assert again["metadata"] == {"name": "train-0", "namespace": "team",
                                 "labels": {"app": "train"}, "annotations": {"note": "mine"}}
    expected_spec = {k: v for k, v in live["spec"].items() if k != "nodeName"}
    assert again["spec"] == expected_spec  # the webhook rewrites the profile at creation
    with pytest.raises(ValueError, match="team/web has no saved pod"):
        recreated_pod(SubstitutionRule("web", "team", P("1g.10gb"), P("2g.20gb"), owner_uid="x"))
