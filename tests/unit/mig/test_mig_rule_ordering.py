"""The ordering between the MIG adapter and the webhook: a MIG pod's rules are read live at
/mutate, so a rule the watch has not delivered yet still rewrites the pod (and a rule already
marked returning no longer does); a failed read falls back to the cache. And a controller
informer on a CRD that is not installed counts as synced (empty), so a cluster without the
MIG CRDs keeps the other controllers working."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

from egpu_testing.clock import InstantSleeps, turns_until
from egpu_testing.webhook_answers import answered
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.mig.rules import SubstitutionRule
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.informer import Informer
from elastic_gpu.webhook.review import Admission, asks_mig
from elastic_gpu.webhook.sources import Lookups

P = MigProfile.parse
FACTS = ClusterFacts(largest_cards=8, largest_cards_node="big", largest_card_memory_mib=81920,
                     largest_memory_node="big", models=frozenset({"A100-SXM4-80GB"}),
                     mig_profiles=frozenset({"nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"}))
RULE = SubstitutionRule("r", "team", P("1g.10gb"), P("2g.20gb"), pod_name="train")


def review(profile: str = "1g.10gb", namespace: str = "team") -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": namespace},
           "spec": {"containers": [{"name": "main", "image": "x", "resources": {
               "limits": {f"nvidia.com/mig-{profile}": "1"}}}]}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"version": "v1", "kind": "Pod"},
                                   "resource": {"version": "v1", "resource": "pods"},
                                   "namespace": namespace, "operation": "CREATE",
                                   "object": pod}}).encode()


#: the webhook's node-level GPU count (core/nodefit.py), added to every GPU pod
NODE_LIMIT = "/spec/containers/0/resources/limits/" + NODE_CORE.replace("/", "~1")


def patched_limits(admission: Admission, body: bytes) -> list[Any]:
    status, payload, _ = answered(asyncio.run(admission.review_async(body, mutate=True)))
    assert status == 200
    response = json.loads(payload)["response"]
    assert response["allowed"]
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return [op["path"] for op in patch if op["op"] == "add" and "/limits/" in op["path"]]


class Rules:
    def __init__(self, *rules: SubstitutionRule, error: Exception | None = None) -> None:
        self.rules = rules
        self.error = error
        self.reads: list[str] = []

    async def fetch(self, namespace: str) -> tuple[SubstitutionRule, ...]:
        self.reads.append(namespace)
        if self.error is not None:
            raise self.error
        return tuple(r for r in self.rules if r.namespace == namespace)


def test_a_rule_the_cache_lacks_is_read_live_and_rewrites_the_pod() -> None:
    api = Rules(RULE)
    seen: list[str] = []
    admission = Admission(FACTS, Lookups(fetch_rules=api.fetch, on_rule_lookup=seen.append))
    assert patched_limits(admission, review()) == [
        "/spec/containers/0/resources/limits/nvidia.com~1mig-2g.20gb", NODE_LIMIT]
    assert api.reads == ["team"] and seen == ["api"]
    # without the live read, the (empty) cache alone leaves the pod as written (but for the
    # node-level GPU count every GPU pod gets)
    assert patched_limits(Admission(FACTS), review()) == [NODE_LIMIT]


def test_a_rule_marked_returning_in_the_api_wins_over_the_cache() -> None:
    returning = SubstitutionRule("r", "team", P("1g.10gb"), P("2g.20gb"), pod_name="train",
                                 returning=True)
    admission = Admission(replace(FACTS, mig_substitutions=(RULE,)),
                          Lookups(fetch_rules=Rules(returning).fetch))
    assert patched_limits(admission, review()) == [NODE_LIMIT]


def test_a_failed_live_read_falls_back_to_the_cache() -> None:
    seen: list[str] = []
    admission = Admission(replace(FACTS, mig_substitutions=(RULE,)),
                          Lookups(fetch_rules=Rules(error=OSError("down")).fetch,
                                  on_rule_lookup=seen.append))
    assert patched_limits(admission, review()) == [
        "/spec/containers/0/resources/limits/nvidia.com~1mig-2g.20gb", NODE_LIMIT]
    assert seen == ["cache"]


def test_pods_asking_no_mig_make_no_read() -> None:
    api = Rules(RULE)
    admission = Admission(FACTS, Lookups(fetch_rules=api.fetch))
    body = json.loads(review())
    body["request"]["object"]["spec"]["containers"][0]["resources"] = {}
    asyncio.run(admission.review_async(json.dumps(body).encode(), mutate=True))
    assert api.reads == []
    assert asks_mig({"spec": {"containers": [{"resources": {"requests": {
        "nvidia.com/mig-1g.10gb": "1"}}}]}})
    assert not asks_mig({"spec": {"containers": [{"resources": {"limits": {
        "nvidia.com/gpu": "1"}}}]}})


@pytest.mark.parametrize("spec", [{"initContainers": True}, {"containers": 3},
                                  {"containers": "x"}, {"containers": [None, 1]}])
def test_a_malformed_pod_is_judged_not_crashed(spec: dict[str, Any]) -> None:
    # The fuzz test's case: `initContainers: true` made the MIG check raise, a 500.
    assert not asks_mig({"spec": spec})
    api = Rules(RULE)
    admission = Admission(FACTS, Lookups(fetch_rules=api.fetch))
    body = json.loads(review())
    body["request"]["object"]["spec"] = spec
    status, _, _ = answered(asyncio.run(admission.review_async(json.dumps(body).encode(),
                                                                mutate=True)))
    assert status == 200


class MissingCrd:
    def __init__(self) -> None:
        self.lists = 0

    async def list(self, path: str, params: Mapping[str, str] | None = None
                   ) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        raise NotFound(404, "NotFound", "the server could not find the requested resource")

    async def watch(self, path: str, resource_version: str,
                    params: Mapping[str, str] | None = None, timeout_s: int = 300
                    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        raise AssertionError("no watch without a list")
        yield ("", {})  # pragma: no cover


async def test_an_optional_informer_on_a_missing_crd_is_synced_and_empty() -> None:
    api, sleeps = MissingCrd(), InstantSleeps()
    optional = Informer(api, "/apis/x/v1/things", name="things", missing_ok=True,
                        missing_retry_s=10, sleep=sleeps)
    task = asyncio.create_task(optional.run())
    await asyncio.wait_for(optional.wait_synced(), 2)
    await turns_until(lambda: api.lists >= 3)
    task.cancel()
    assert optional.items() == []
    assert sleeps.delays[:2] == [10, 10]  # it keeps looking, every missing_retry_s
    required_api, backoffs = MissingCrd(), InstantSleeps()
    required = Informer(required_api, "/apis/x/v1/things", name="things",
                        backoff_s=(1, 8), sleep=backoffs)
    task = asyncio.create_task(required.run())
    await turns_until(lambda: required_api.lists >= 5)
    task.cancel()
    assert not required.has_synced
    # after each failed list: the base doubled per failure in a row, capped, with jitter
    # (x 0.5 to 1)
    d = backoffs.delays
    assert len(d) >= 4 and 1 <= d[0] <= 2 and 2 <= d[1] <= 4
    assert 4 <= d[2] <= 8 and 4 <= d[3] <= 8  # the cap
