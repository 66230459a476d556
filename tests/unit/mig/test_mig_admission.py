"""The MIG adapter's rewrite at admission: a pod a MIGSubstitution selects gets the rule's
profile, the original request recorded, and nothing more on reinvocation."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import MUTATORS
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.mig.rules import MIG_ORIGINAL, MIG_SUBSTITUTION, SubstitutionRule
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.resources import MigProfile

P = MigProfile.parse
OWNER = "6f1c2a3b-0000-4000-8000-0123456789ab"
FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     largest_memory_node="big", models=frozenset({"A100-SXM4-80GB"}),
                     mig_profiles=frozenset({"nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb",
                                             "nvidia.com/mig-3g.40gb"}))
BY_OWNER = SubstitutionRule("web", "team", P("1g.10gb"), P("2g.20gb"), owner_uid=OWNER)
BY_NAME = SubstitutionRule("bare", "team", P("1g.10gb"), P("3g.40gb"), pod_name="train-0")


def pod(name: str = "web-abc12", *, owner: str | None = OWNER, namespace: str = "team",
        containers: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None
        ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                                    "uid": owner, "controller": True}]
    if annotations is not None:
        meta["annotations"] = annotations
    mig = {"nvidia.com/mig-1g.10gb": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "containers": containers or [{"name": "main", "image": "x",
                                      "resources": {"limits": dict(mig), "requests": dict(mig)}}]}}


def counted(p: dict[str, Any], value: str) -> dict[str, Any]:
    """`p` with the webhook's node-level GPU count (`core.nodefit`) on its first container."""
    out = copy.deepcopy(p)
    for values in out["spec"]["containers"][0]["resources"].values():
        values[NODE_CORE] = value
    return out


def mutated(p: dict[str, Any], *rules: SubstitutionRule) -> tuple[dict[str, Any], int]:
    verdict = admit(p, replace(FACTS, mig_substitutions=rules), mutate=True)
    assert verdict.allowed, verdict.message
    return apply_patch(p, verdict.patch), len(verdict.patch)


def test_the_rule_is_in_the_mutators() -> None:
    assert any(m.__name__ == "mig_substitution" for m in MUTATORS)


def test_an_owners_replacement_gets_the_rules_profile_and_keeps_the_original() -> None:
    before = pod()
    after, n = mutated(before, BY_OWNER)
    assert n > 0
    resources = after["spec"]["containers"][0]["resources"]
    # the node-level GPU count follows the new profile (2g: 28, not 1g's 14)
    assert resources == {"limits": {"nvidia.com/mig-2g.20gb": "1", NODE_CORE: "28"},
                         "requests": {"nvidia.com/mig-2g.20gb": "1", NODE_CORE: "28"}}
    assert after["metadata"]["annotations"] == {MIG_ORIGINAL: "main=1g.10gb",
                                                MIG_SUBSTITUTION: "web"}
    # everything else is as the user wrote it
    stripped = copy.deepcopy(after)
    stripped["spec"]["containers"][0]["resources"] = before["spec"]["containers"][0]["resources"]
    del stripped["metadata"]["annotations"]
    assert stripped == before
    # reinvocation: nothing more
    again, n = mutated(after, BY_OWNER)
    assert n == 0 and again == after


def test_a_bare_pod_is_selected_by_name_in_the_rules_namespace() -> None:
    after, _ = mutated(pod("train-0", owner=None, annotations={"keep": "me"}), BY_NAME)
    assert after["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1",
                                                                     NODE_CORE: "42"}
    assert after["metadata"]["annotations"] == {"keep": "me", MIG_ORIGINAL: "main=1g.10gb",
                                                MIG_SUBSTITUTION: "bare"}


def test_pods_the_rule_does_not_select_are_untouched() -> None:
    for other in (pod("train-1", owner=None), pod(owner="another-uid"),
                  pod("train-0", owner=None, namespace="elsewhere"), pod(owner=None)):
        after, n = mutated(other, BY_OWNER, BY_NAME)
        assert n == 2 and after == counted(other, "14")  # only the node-level count
    # selected, but asking another profile: untouched
    p = pod(containers=[{"name": "main", "image": "x",
                         "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}])
    after, n = mutated(p, BY_OWNER)
    assert n == 1 and after == counted(p, "42")


def test_every_container_is_rewritten_with_its_amount() -> None:
    containers = [
        {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "2"}}},
        {"name": "b", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1},
                                                  "requests": {"nvidia.com/mig-1g.10gb": 1}}},
        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}},
    ]
    after, _ = mutated(pod(containers=containers), BY_OWNER)
    resources = [c["resources"] for c in after["spec"]["containers"]]
    assert resources == [{"limits": {"nvidia.com/mig-2g.20gb": "2", NODE_CORE: "56"}},
                         {"limits": {"nvidia.com/mig-2g.20gb": 1, NODE_CORE: "28"},
                          "requests": {"nvidia.com/mig-2g.20gb": 1, NODE_CORE: "28"}},
                         {"limits": {"nvidia.com/mig-3g.40gb": "1", NODE_CORE: "42"}}]
    assert after["metadata"]["annotations"][MIG_ORIGINAL] == "a=1g.10gb,b=1g.10gb"


def test_a_pod_moved_again_keeps_its_first_original() -> None:
    first, _ = mutated(pod(), BY_OWNER)
    again = SubstitutionRule("web-2", "team", P("2g.20gb"), P("3g.40gb"), owner_uid=OWNER)
    after, _ = mutated(first, BY_OWNER, again)
    assert after["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1",
                                                                     NODE_CORE: "42"}
    assert after["metadata"]["annotations"] == {MIG_ORIGINAL: "main=1g.10gb",
                                                MIG_SUBSTITUTION: "web-2"}
