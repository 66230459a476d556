"""Must-show 4 of issue #17, the apiserver's half: a ResourceQuota of one card in canonical
units (`requests.quota.elasticgpu.io/gpu-core: 100`) admits two half-card pods written with
different aliases and refuses the third with the quota's own message, once the pods carry the
accounting resources `core.quota.quota_resources` adds (the pods are created as the webhook's
patch leaves them; running the webhook itself with QUOTA_MUTATORS is left to its adapter)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from elastic_gpu.core.admission.admit import admit
from elastic_gpu.core.admission.chain import QUOTA_MUTATORS
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import apply_patch
from elastic_gpu.core.quota import QUOTA_CORE

pytestmark = pytest.mark.integration


def _as_mutated(name: str, ns: str, alias: str) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "main", "image": "cuda",
                                 "resources": {"limits": {alias: "50"}}}]}}
    verdict = admit(pod, ClusterFacts(), mutate=True, mutators=QUOTA_MUTATORS)
    assert verdict.allowed, verdict.message
    out: dict[str, Any] = apply_patch(pod, verdict.patch)
    return out


def test_one_card_quota_in_canonical_units(k8s_cluster: Any, k8s_namespace: str) -> None:
    if not k8s_cluster.controller_manager:
        pytest.skip("ResourceQuota needs kube-controller-manager to compute its status")
    ns = k8s_namespace
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"hard": {f"requests.{QUOTA_CORE}": "100"}}}))
    deadline = time.monotonic() + 30
    while not json.loads(k8s_cluster.kubectl("get", "resourcequota", "gpu", "-n", ns, "-o",
                                             "json").stdout).get("status", {}).get("hard"):
        assert time.monotonic() < deadline, "quota status never computed"
        time.sleep(0.2)
    for name, alias in (("a", "tencent.com/vcuda-core"), ("b", "nano-gpu/gpu-percent")):
        k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(_as_mutated(name, ns, alias)))
    third = k8s_cluster.kubectl("create", "-f", "-", check=False, input=json.dumps(
        _as_mutated("c", ns, "tencent.com/vcuda-core")))
    assert third.returncode != 0
    assert 'pods "c" is forbidden: exceeded quota: gpu' in third.stderr, third.stderr
    assert f"requested: requests.{QUOTA_CORE}=50" in third.stderr
    assert f"used: requests.{QUOTA_CORE}=100, limited: requests.{QUOTA_CORE}=100" in third.stderr
    print(third.stderr)
