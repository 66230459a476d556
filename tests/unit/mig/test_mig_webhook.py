"""The webhook adapter's part of the MIG rewrite: the rule cache follows list and watch
events, and a review of a pod a rule selects comes back with the rule's patch."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
from typing import Any

from egpu_testing.webhook_answers import answered
from elastic_gpu.core.admission.facts import NodeGpus
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.mig.rules import MIG_ORIGINAL
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.webhook.migrules import RuleCache
from elastic_gpu.webhook.server import WebhookOptions, WebhookServer

OWNER = "6f1c2a3b-0000-4000-8000-0123456789ab"


def rule_object(name: str, namespace: str = "team", **selector: str) -> dict[str, Any]:
    return {"apiVersion": "elasticgpu.io/v1alpha", "kind": "MIGSubstitution",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": selector or {"ownerUID": OWNER}, "fromProfile": "1g.10gb",
                     "toProfile": "2g.20gb"}}


def test_the_rule_cache_follows_list_and_watch_events() -> None:
    seen: list[tuple[str, ...]] = []
    cache = RuleCache(lambda rules: seen.append(tuple(r.name for r in rules)))
    cache.replace([rule_object("a"), rule_object("b", "other", podName="p"),
                   {"metadata": {"name": "broken", "namespace": "team"}, "spec": 3}])
    assert seen == [("b", "a")]  # (namespace, name) order
    cache.event("ADDED", rule_object("c"))
    cache.event("DELETED", rule_object("b", "other", podName="p"))
    cache.event("DELETED", rule_object("never-seen"))  # no change, no call
    assert seen[1:] == [("b", "a", "c"), ("a", "c")]


def _review(pod: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "kind": {"version": "v1", "kind": "Pod"},
                                   "resource": {"version": "v1", "resource": "pods"},
                                   "namespace": "team", "operation": "CREATE",
                                   "object": pod}}).encode()


def test_a_rule_from_the_watch_rewrites_the_owners_next_pod() -> None:
    server = WebhookServer(WebhookOptions())
    server.set_nodes([NodeGpus("a100", 0, 0, "A100-SXM4-80GB",
                               frozenset({"nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"}))])
    mig = {"nvidia.com/mig-1g.10gb": "1"}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web-x", "namespace": "team",
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "web", "uid": OWNER,
                                             "apiVersion": "apps/v1"}]},
           "spec": {"containers": [{"name": "main", "image": "x",
                                    "resources": {"limits": dict(mig), "requests": dict(mig)}}]}}

    def patched() -> dict[str, Any]:
        _, body, _ = answered(asyncio.run(server.admission.review_async(_review(pod), mutate=True)))
        response = json.loads(body)["response"]
        assert response["allowed"], response
        ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        out: dict[str, Any] = apply_patch(pod, ops)
        return out

    # no rule: the pod as written, with only the node-level GPU count of its 1g instance
    as_written = copy.deepcopy(pod)
    for values in as_written["spec"]["containers"][0]["resources"].values():
        values[NODE_CORE] = "14"
    assert patched() == as_written
    server.rule_cache.event("ADDED", rule_object("web"))
    after = patched()
    assert after["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-2g.20gb": "1",
                                                                     NODE_CORE: "28"}
    assert after["metadata"]["annotations"][MIG_ORIGINAL] == "main=1g.10gb"
    # nodes changing keep the rules; the rule's deletion ends the rewrite
    server.set_nodes([NodeGpus("a100", 0, 0, "A100-SXM4-80GB",
                               frozenset({"nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"}))])
    assert patched() == after
    server.rule_cache.event("DELETED", rule_object("web"))
    assert patched() == as_written


class _Client:
    """A client without the CRD, then with one rule (`kube.informer.ListWatcher`)."""

    def __init__(self) -> None:
        self.lists = 0
        self.watched = asyncio.Event()

    async def list(self, path: str, params: Any = None) -> tuple[list[dict[str, Any]], str]:
        from elastic_gpu.kube.errors import NotFound

        self.lists += 1
        if self.lists == 1:
            raise NotFound(404, "NotFound", "not found")
        return [rule_object("a")], "1"

    async def watch(self, path: str, resource_version: str, params: Any = None,
                    timeout_s: int = 300) -> Any:
        self.watched.set()
        await asyncio.sleep(3600)
        yield None  # pragma: no cover


def test_the_rule_cache_without_the_crd_has_no_rules_and_lists_again_later() -> None:
    async def scenario() -> None:
        cache = RuleCache(crd_retry_s=0.01)
        client = _Client()
        task = asyncio.create_task(cache.run(client))
        await asyncio.wait_for(cache.synced.wait(), 5)
        await asyncio.wait_for(client.watched.wait(), 5)
        assert [r.name for r in cache.snapshot()] == ["a"] and client.lists == 2
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
