"""The server's HTTP-free part: AdmissionReview bytes in, status and AdmissionReview out."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_testing.webhook_answers import answered
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.webhook.registration import Scope, Target, configurations, match_expression
from elastic_gpu.webhook.review import Admission

FACTS = ClusterFacts(largest_cards=8, largest_cards_node="n1")


def review(obj: Any, *, uid: str = "u-1", operation: str = "CREATE", kind: str = "Pod",
           resource: str = "pods") -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": uid, "kind": {"version": "v1", "kind": kind},
                                   "resource": {"version": "v1", "resource": resource},
                                   "operation": operation, "object": obj}}).encode()


def pod(limits: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "main", "resources": {"limits": limits, "requests": limits}}]}}


def answer(body: bytes, mutate: bool = True) -> tuple[int, dict[str, Any]]:
    status, payload, _ = answered(Admission(FACTS).review(body, mutate=mutate))
    return status, json.loads(payload)


def test_allowed_with_patch_from_mutate_only() -> None:
    body = review(pod({"tencent.com/vcuda-core": "50"}))
    status, out = answer(body)
    assert status == 200 and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/metadata/annotations",
         "value": {"tencent.com/vcuda-core-limit": "50"}},
        *({"op": "add", "path": f"/spec/containers/0/resources/{part}/node.elasticgpu.io~1gpu-core",
           "value": "50"} for part in ("limits", "requests"))]
    _, validated = answer(body, mutate=False)
    assert "patch" not in validated["response"] and validated["response"]["allowed"]


def test_refused_with_the_rule() -> None:
    status, out = answer(review(pod({"nvidia.com/gpu": "9"})))
    assert status == 200
    response = out["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert "has 8 cards" in response["status"]["message"]


def test_not_a_review_is_400_naming_what_is_wrong() -> None:
    for body, words in ((b"{", "not an AdmissionReview"),
                        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
                         "v1beta1"),
                        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
                         "request.uid"),
                        (b'{"apiVersion": 1}', "apiVersion")):
        status, out = answer(body)
        assert status == 400 and words in out["error"], (body, out)


def test_what_is_not_a_pod_create_is_allowed_untouched() -> None:
    for body in (review(pod({"nvidia.com/gpu": "99"}), operation="UPDATE"),
                 review({}, kind="Deployment", resource="deployments")):
        status, out = answer(body)
        assert status == 200 and out["response"]["allowed"] and "patch" not in out["response"]


@settings(max_examples=500, deadline=None)
@given(obj=st.recursive(st.none() | st.integers() | st.text(max_size=5) | st.floats(allow_nan=False,
                                                                       allow_infinity=False),
                        lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(
                            ["metadata", "spec", "containers", "initContainers", "resources",
                             "limits", "requests", "name", "annotations", "nvidia.com/gpu",
                             "cpu", "overhead"]), inner, max_size=4), max_leaves=25))
def test_any_object_gets_an_answer_never_an_exception(obj: Any) -> None:
    status, out = answer(review(obj))
    assert status == 200 and out["response"]["uid"] == "u-1"
    if not out["response"]["allowed"]:
        message = out["response"]["status"]["message"]
        assert message and "webhook error" not in message  # a rule, not a caught exception


def test_registration_scope() -> None:
    mutating, validating = configurations(
        "egpu", Target(url="https://127.0.0.1:9443"), "Q0E=", Scope(namespace="egpu-system"))
    hook, claims = mutating["webhooks"]
    assert claims["name"] == "elasticgpuclaims.mutate.elasticgpu.io"
    assert claims["failurePolicy"] == "Fail" and "namespaceSelector" not in claims
    assert claims["rules"] == [{"apiGroups": ["elasticgpu.io"], "apiVersions": ["*"],
                                "operations": ["CREATE"], "resources": ["elasticgpuclaims"],
                                "scope": "Namespaced"}]
    assert claims["clientConfig"]["url"].endswith("/mutate-claims")
    assert hook["failurePolicy"] == "Fail" and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["clientConfig"] == {"caBundle": "Q0E=", "url": "https://127.0.0.1:9443/mutate"}
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["timeoutSeconds"] <= 10
    excluded = hook["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and excluded["values"] == ["egpu-system", "kube-system"]
    assert validating["webhooks"][0]["clientConfig"]["url"].endswith("/validate")
    assert "reinvocationPolicy" not in validating["webhooks"][0]
    service = Target(service_name="egpu-webhook", service_namespace="egpu-system")
    assert service.client_config("/mutate", "x")["service"]["path"] == "/mutate"
    expression = match_expression()
    assert "'tencent.com/vcuda-core'" in expression and "nvidia.com/mig-" in expression
    assert "egpuc.elasticgpu.io/" in expression


def test_every_claim_created_gets_the_protection_finalizer_and_keeps_its_others() -> None:
    """Issue #26, item 2: the finalizer is on every claim from its creation."""
    def claim_review(meta: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
        body = review({"apiVersion": "elasticgpu.io/v1alpha", "kind": "ElasticGPUClaim",
                       "metadata": meta, "spec": {}}, kind="ElasticGPUClaim",
                      resource="elasticgpuclaims", operation=operation)
        status, payload, _ = answered(Admission(FACTS).review_claim(body))
        assert status == 200
        response: dict[str, Any] = json.loads(payload)["response"]
        assert response["allowed"] is True
        return response

    def patch(response: dict[str, Any]) -> Any:
        return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []

    assert patch(claim_review({"name": "c"})) == [
        {"op": "add", "path": "/metadata/finalizers", "value": ["elasticgpu.io/claim-protection"]}]
    assert patch(claim_review({"name": "c", "finalizers": ["example.com/mine"]})) == [
        {"op": "add", "path": "/metadata/finalizers/-", "value": "elasticgpu.io/claim-protection"}]
    assert patch(claim_review({"name": "c", "finalizers": ["elasticgpu.io/claim-protection"]})) \
        == []
    assert patch(claim_review({"name": "c"}, operation="UPDATE")) == []  # not governed
    status, _, verdict = answered(Admission(FACTS).review_claim(b"{"))
    assert status == 400 and verdict == "bad_request"


def test_deep_nesting_is_a_400_naming_the_limit_before_decoding() -> None:
    """Issue 26, item 8: nesting is bounded on the bytes, before msgspec or the core walk it."""
    admission = Admission()
    for body in (b"[" * 100_000 + b"]" * 100_000,
                 b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
                 b'{"uid": "u", "object": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}}"):
        status, payload, verdict = answered(admission.review(body, mutate=True))
        assert (status, verdict) == (400, "bad_request")
        assert "levels deep, more than the limit of 256" in json.loads(payload)["error"]
