"""The webhook refuses malformed TFLOPS requests at create time, naming the rule (issue 28)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from egpu_testing.webhook_answers import answered
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.webhook.review import Admission

FACTS = ClusterFacts(largest_cards=8, largest_cards_node="n1")


def review(limits: dict[str, Any]) -> bytes:
    obj = {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "main", "resources": {"limits": limits, "requests": limits}}]}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u-1", "kind": {"version": "v1", "kind": "Pod"},
                                   "resource": {"version": "v1", "resource": "pods"},
                                   "operation": "CREATE", "object": obj}}).encode()


def response(limits: dict[str, Any]) -> dict[str, Any]:
    status, payload, _ = answered(Admission(FACTS).review(review(limits), mutate=False))
    assert status == 200  # a refusal is an answer, never a 5xx
    out: dict[str, Any] = json.loads(payload)["response"]
    return out


def test_a_tflops_request_is_admitted() -> None:
    assert response({"elasticgpu.io/gpu-tflops": "100",
                     "elasticgpu.io/gpu-memory": "4096"})["allowed"] is True


@pytest.mark.parametrize("value, needle", [
    ("0", "a positive whole number"),
    ("-3", "a positive whole number"),
    ("2.5", "a positive whole number"),
    ("100Gi", "without a byte suffix"),
    ("lots", "digits 0-9"),
])
def test_a_malformed_tflops_value_is_refused_with_its_rule(value: str, needle: str) -> None:
    out = response({"elasticgpu.io/gpu-tflops": value})
    assert out["allowed"] is False and out["status"]["code"] in (400, 403, 422)
    message = out["status"]["message"]
    assert "elasticgpu.io/gpu-tflops" in message and needle in message


def test_tflops_beside_a_percent_is_refused() -> None:
    out = response({"elasticgpu.io/gpu-tflops": "10", "elasticgpu.io/gpu-core": "20"})
    assert out["allowed"] is False
    assert "TFLOPS, in percent or in whole cards" in out["status"]["message"]
