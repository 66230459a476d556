"""The adapter's part of claim admission: claims from the watch cache, a live read on a miss
only, a failed read refused (never a 5xx), and the claim cache fed by list and watch events."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from typing import Any

import pytest
import yaml

from egpu_testing.seed import seed_pod
from egpu_testing.webhook_answers import answered
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.core.names import InvalidName
from elastic_gpu.webhook.cluster import ClaimCache
from elastic_gpu.webhook.review import Admission
from elastic_gpu.webhook.sources import Lookups

REQUESTS: dict[str, int | str] = {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
                                  "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}


def claim(name: str, namespace: str = "team-a") -> Claim:
    return Claim(namespace, name, f"uid-{name}", "gpushare-egpuclass", REQUESTS)


def claim_object(name: str, namespace: str = "team-a", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "elasticgpu.io/v1alpha", "kind": "ElasticGPUClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **meta},
            "spec": {"egpuClassName": "gpushare-egpuclass",
                     "resources": {"requests": dict(REQUESTS)}}}


def review(claim_name: str, namespace: str = "team-a") -> bytes:
    pod = yaml.safe_load(seed_pod("test-cuda-1", claim_name))
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "kind": {"version": "v1", "kind": "Pod"},
                                   "resource": {"version": "v1", "resource": "pods"},
                                   "namespace": namespace, "operation": "CREATE",
                                   "object": pod}}).encode()


class Api:
    """The claims the API has, and the live reads made."""

    def __init__(self, *claims: Claim, error: Exception | None = None) -> None:
        self.claims = {(c.namespace, c.name): c for c in claims}
        self.reads: list[tuple[str, str]] = []
        self.error = error

    async def fetch(self, namespace: str, name: str) -> Claim | None:
        self.reads.append((namespace, name))
        if self.error is not None:
            raise self.error
        return self.claims.get((namespace, name))


def judge(admission: Admission, body: bytes) -> tuple[dict[str, Any], str]:
    status, payload, verdict = answered(asyncio.run(admission.review_async(body, mutate=True)))
    assert status == 200
    response: dict[str, Any] = json.loads(payload)["response"]
    return response, verdict


def test_a_cached_claim_is_used_without_an_api_call() -> None:
    cache = {("team-a", "c1"): claim("c1")}
    api = Api()
    admission = Admission(ClusterFacts(), Lookups(claims=lambda ns, n: cache.get((ns, n)),
                                                   fetch=api.fetch))
    response, verdict = judge(admission, review("c1"))
    assert response["allowed"] and verdict == "patched" and api.reads == []
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch[0]["value"]["limits"] == {"elasticgpu.io/gpu-core": "10",
                                           "elasticgpu.io/gpu-memory": "4"}


def test_a_claim_the_cache_lacks_is_read_live_before_judging() -> None:
    api = Api(claim("just-made"))
    admission = Admission(ClusterFacts(), Lookups(fetch=api.fetch))
    response, verdict = judge(admission, review("just-made"))
    assert response["allowed"] and verdict == "patched"
    assert api.reads == [("team-a", "just-made")]


def test_a_claim_neither_cached_nor_in_the_api_is_refused_with_the_namespace() -> None:
    api = Api(claim("c1", namespace="team-b"))
    response, verdict = judge(Admission(ClusterFacts(), Lookups(fetch=api.fetch)), review("c1"))
    assert not response["allowed"] and verdict == "refused:claim-not-found"
    assert "ElasticGPUClaim c1 does not exist in namespace team-a; create it first" in \
        response["status"]["message"]


def test_a_failed_live_read_is_a_refusal_saying_so_not_an_error() -> None:
    api = Api(error=ConnectionError("apiserver unreachable"))
    response, verdict = judge(Admission(ClusterFacts(), Lookups(fetch=api.fetch)), review("c1"))
    assert not response["allowed"] and response["status"]["code"] == 403
    assert "ElasticGPUClaim c1 in namespace team-a could not be read" in \
        response["status"]["message"] and "try again" in response["status"]["message"]
    assert verdict == "refused:claim-lookup"


def test_the_synchronous_review_uses_the_cache_only() -> None:
    api = Api(claim("c1"))
    admission = Admission(ClusterFacts(), Lookups(fetch=api.fetch))
    _, _, verdict = answered(admission.review(review("c1"), mutate=True))
    assert verdict == "refused:claim-not-found" and api.reads == []


def test_the_claim_cache_follows_list_and_watch_events() -> None:
    cache = ClaimCache()
    cache.replace([claim_object("a"), claim_object("b", "team-b"),
                   {"metadata": {"name": "broken", "namespace": "team-a"}, "spec": 3}])
    assert cache.get("team-a", "a") == claim("a")
    assert cache.get("team-b", "b") == claim("b", "team-b")
    assert cache.get("team-a", "broken") is None
    cache.event("ADDED", claim_object("c"))
    cache.event("MODIFIED", claim_object("a", deletionTimestamp="2026-01-01T00:00:00Z"))
    cache.event("DELETED", claim_object("b", "team-b"))
    assert cache.get("team-a", "c") == claim("c")
    deleting = cache.get("team-a", "a")
    assert deleting is not None and deleting.deleting
    assert cache.get("team-b", "b") is None


def test_the_claim_cache_without_a_client_finds_nothing_live() -> None:
    assert asyncio.run(ClaimCache().fetch("team-a", "a")) is None


def test_lookups_are_reported_by_where_the_claim_was_found() -> None:
    cache = {("team-a", "cached"): claim("cached")}
    seen: list[str] = []
    admission = Admission(ClusterFacts(), Lookups(claims=lambda ns, n: cache.get((ns, n)),
                                                  fetch=Api(claim("fresh")).fetch,
                                                  on_claim_lookup=seen.append))
    judge(admission, review("cached"))
    judge(admission, review("fresh"))
    assert seen == ["cache", "api"]


class _Client:
    """The API without the ElasticGPUClaim CRD at first, then with it (one claim, one event)."""

    def __init__(self) -> None:
        self.lists = 0
        self.watched = asyncio.Event()

    async def list(self, path: str, params: Any = None) -> tuple[list[dict[str, Any]], str]:
        from elastic_gpu.kube.errors import NotFound

        self.lists += 1
        if self.lists == 1:
            raise NotFound(404, "NotFound", "the server could not find it")
        return [claim_object("a")], "7"

    async def watch(self, path: str, resource_version: str, params: Any = None,
                    timeout_s: int = 300) -> Any:
        yield "ADDED", claim_object("b")
        self.watched.set()
        await asyncio.Event().wait()


def test_the_claim_cache_without_the_crd_has_no_claims_and_lists_again_later() -> None:
    async def scenario() -> None:
        cache = ClaimCache(crd_retry_s=0.01)
        client = _Client()
        task = asyncio.create_task(cache.run(client))
        await asyncio.wait_for(cache.synced.wait(), 5)
        assert cache.claims == {} and client.lists >= 1
        await asyncio.wait_for(client.watched.wait(), 5)
        assert cache.crd_installed and set(cache.claims) == {("team-a", "a"), ("team-a", "b")}
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


HOSTILE_NAMESPACE = "../../../../api/v1/nodes/x#"


def test_a_namespace_no_api_server_sends_is_refused_with_no_read() -> None:
    """Issue 26, item 10: the review's namespace went into the claim read's path as it was,
    and `../../../../api/v1/nodes/x#` made the webhook GET a Node with its own rights."""
    api = Api(claim("c1"))
    status, payload, verdict = answered(asyncio.run(
        Admission(ClusterFacts(), Lookups(fetch=api.fetch))
        .review_async(review("c1", HOSTILE_NAMESPACE), mutate=True)))
    assert (status, verdict) == (400, "bad_request") and api.reads == []
    error = json.loads(payload)["error"]
    assert f"request.namespace {HOSTILE_NAMESPACE!r}" in error and "DNS-1123 label" in error


def test_the_claim_read_checks_its_names_before_any_request() -> None:
    class Reader:
        def __init__(self) -> None:
            self.paths: list[str] = []

        async def get(self, path: str) -> dict[str, Any]:
            self.paths.append(path)
            return claim_object("c1")

    cache = ClaimCache()
    cache.reader = reader = Reader()
    with pytest.raises(InvalidName, match="DNS-1123 label"):
        asyncio.run(cache.fetch(HOSTILE_NAMESPACE, "c1"))
    assert reader.paths == [] and cache.fetches == 0
    assert asyncio.run(cache.fetch("team-a", "c1")) == claim("c1")
    assert reader.paths == ["/apis/elasticgpu.io/v1alpha/namespaces/team-a/elasticgpuclaims/c1"]
