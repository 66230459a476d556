"""Elastic GPU API objects for tests: classes, claims, ElasticGPUs and pods that name claims,
and, against a real API server, the claim binding the controller writes (so the extender's
tests do not need `egpu controller`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core.annotations import CLAIM_PREFIX
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.model import GPUSHARE, ClaimRef

ROOT = Path(__file__).resolve().parents[2]


def class_object(name: str, *, provisioner: str = GPUSHARE,
                 mode: str = "Immediate", reclaim: str = "Delete",
                 parameters: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": name},
            "provisioner": provisioner, "parameters": dict(parameters or {}),
            "reclaimPolicy": reclaim, "egpuBindingMode": mode}


def claim_object(name: str, requests: Mapping[str, int | str], *, namespace: str = "default",
                 uid: str | None = None, class_name: str | None = "share",
                 elastic_gpu: str | None = None, phase: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"requests": dict(requests)}}
    if class_name is not None:
        spec["egpuClassName"] = class_name
    if elastic_gpu is not None:
        spec["elasticGPUName"] = elastic_gpu
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid is not None:
        meta["uid"] = uid
    return {"apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": meta,
            "spec": spec, "status": {"phase": phase} if phase else {}}


def elasticgpu_object(name: str, node: str, shares: list[CardShare], *,
                      capacity: Mapping[str, int | str] | None = None,
                      claim: tuple[str, str, str] | None = None, phase: str | None = None,
                      class_name: str | None = None, uid: str | None = None) -> dict[str, Any]:
    egpu = claim_model.ElasticGPU(
        name=name, capacity=dict(capacity or {"elasticgpu.io/gpu-core": 10}), node=node,
        shares=tuple(shares), claim_ref=ClaimRef(*claim) if claim else None,
        class_name=class_name)
    obj = api.elasticgpu_to_object(egpu)
    obj["status"] = {"phase": phase} if phase else {}
    if uid is not None:
        obj["metadata"]["uid"] = uid
    return obj


def claim_pod(name: str, claims: Mapping[str, str], *, namespace: str = "default",
              resources: Mapping[str, Mapping[str, str]] | None = None,
              uid: str | None = None) -> dict[str, Any]:
    """A pod whose containers name claims, as the webhook leaves it: `egpuc.elasticgpu.io/
    <container>: <claim>` annotations and the claims' resources in the containers
    (`resources`: container -> limits; every container named in `claims` needs an entry)."""
    containers = dict(resources or {c: {} for c in claims})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                         "resourceVersion": "3",
                         "annotations": {f"{CLAIM_PREFIX}{c}": claim for c, claim in claims.items()}},
            "spec": {"containers": [{"name": c, "image": "busybox",
                                     "resources": {"limits": dict(r), "requests": dict(r)}}
                                    for c, r in containers.items()]}}


# ---- against a real control plane -------------------------------------------------------------


def install_crds(cluster: Any) -> None:
    """Apply the three CRDs of the Elastic GPU API and wait until they are served."""
    for filename in api.CRD_FILES.values():
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds" / filename))
    for plural in api.CRD_FILES:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        f"crd/{plural}.{api.GROUP}")
    deadline = time.monotonic() + 30
    for short in (api.CLASS_SHORT, api.CLAIM_SHORT, api.EGPU_SHORT):
        while cluster.kubectl("get", short, "-A", check=False).returncode != 0:
            assert time.monotonic() < deadline, f"{short} not served"
            time.sleep(0.1)


def get_json(cluster: Any, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)
    return result


def bind_claim_as_controller(cluster: Any, namespace: str, claim: str, egpu: str) -> None:
    """What `egpu controller` does once an ElasticGPU is provisioned for (pre-bound to) a
    claim (docs/claims.md, decide -> Bind): ElasticGPU status Bound, then the claim's
    spec.elasticGPUName and status Bound."""
    cluster.kubectl("patch", "egpu", egpu, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"phase": "Bound"}}))
    cluster.kubectl("patch", "egpuc", claim, "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"elasticGPUName": egpu}}))
    node = get_json(cluster, "egpu", egpu)["spec"]["node"]
    cluster.kubectl("patch", "egpuc", claim, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {
                        "phase": "Bound", "elasticGPUName": egpu, "node": node}}))
