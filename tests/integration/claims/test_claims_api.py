"""The Elastic GPU API's CRDs on the real kube-apiserver (issue #15, the API part).

The seed README's class and claims are accepted verbatim; nonsense is refused by the schema
with a message that names the field and the rule; `kubectl get egpuclass,egpuc,egpu` prints
the printer columns.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.seed import SEED_CLASS_AND_CLAIMS
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.claims import binding as claim_binding
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims.decisions import Provision
from elastic_gpu.core.claims.model import (
    GPUSHARE,
    WHOLE_CARDS,
    BindingMode,
    ClaimRef,
    ElasticGPU,
    ElasticGPUPhase,
    GPUClass,
    ReclaimPolicy,
    provisioned_name,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def crds(k8s_cluster: Any) -> Any:
    install_crds(k8s_cluster)
    return k8s_cluster


def _claim(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND,
                       "metadata": {"name": name}, "spec": spec})


def _class(name: str, **top: Any) -> str:
    return json.dumps({"apiVersion": api.API_VERSION, "kind": api.CLASS_KIND,
                       "metadata": {"name": name}, **top})


def test_seed_readme_class_and_claims_are_accepted_verbatim(crds: Any, k8s_namespace: str) -> None:
    crds.kubectl("delete", "egpuclass", "gpushare-egpuclass", "--ignore-not-found")
    crds.kubectl("create", "-n", k8s_namespace, "-f", "-", input=SEED_CLASS_AND_CLAIMS)
    try:
        cls = json.loads(crds.kubectl("get", "egpuclass", "gpushare-egpuclass", "-o", "json").stdout)
        assert api.class_from_object(cls) == GPUClass(
            "gpushare-egpuclass", GPUSHARE, {}, ReclaimPolicy.RETAIN,
            BindingMode.IMMEDIATE)
        listed = json.loads(crds.kubectl("get", "egpuc", "-n", k8s_namespace, "-o", "json").stdout)
        claims = sorted((api.claim_from_object(o) for o in listed["items"]), key=lambda c: c.name)
        assert [c.name for c in claims] == ["gpushare-egpuc-1", "gpushare-egpuc-2"]
        for claim in claims:
            assert claim.requests == {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
                                      "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}
            assert claim.class_name == "gpushare-egpuclass" and claim.uid
            # the class and claim as stored decide a provisioning by the share plug-in
            decision = claim_binding.decide(claim, {"gpushare-egpuclass": api.class_from_object(cls)}, {})
            assert isinstance(decision, Provision)
            assert decision.request.containers[0].compute_milli == 100
    finally:
        crds.kubectl("delete", "egpuclass", "gpushare-egpuclass", "--ignore-not-found")


def test_class_defaults_are_filled_in(crds: Any) -> None:
    name = unique_name("defaults")
    crds.kubectl("create", "-f", "-", input=_class(name, provisioner=WHOLE_CARDS))
    try:
        obj = json.loads(crds.kubectl("get", "egpuclass", name, "-o", "json").stdout)
        assert (obj["reclaimPolicy"], obj["egpuBindingMode"]) == ("Delete", "Immediate")
    finally:
        crds.kubectl("delete", "egpuclass", name)


@pytest.mark.parametrize(("top", "words"), [
    ({"provisioner": GPUSHARE, "reclaimPolicy": "Recycle"},
     ['reclaimPolicy: Unsupported value: "Recycle"', '"Retain"', '"Delete"']),
    ({"provisioner": GPUSHARE, "egpuBindingMode": "Lazy"},
     ['egpuBindingMode: Unsupported value: "Lazy"', '"WaitForFirstConsumer"']),
    ({"reclaimPolicy": "Retain"}, ["provisioner: Required value"]),
    ({"provisioner": "Not A Provisioner!"}, ["provisioner: Invalid value", "should match"]),
    ({"provisioner": GPUSHARE, "parameters": {"models": 3}},
     ["parameters.models: Invalid value", "string"]),
])
def test_nonsense_classes_are_refused(crds: Any, top: dict[str, Any], words: list[str]) -> None:
    result = crds.kubectl("create", "-f", "-", input=_class(unique_name("bad"), **top), check=False)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr


GOOD_REQUESTS = {"gpushare.provisioner.elasticgpu.io/gpu-core": 10}


@pytest.mark.parametrize(("spec", "words"), [
    ({"resources": {"requests": GOOD_REQUESTS}},
     ["spec: Invalid value", "spec.egpuClassName is required"]),
    ({"egpuClassName": "c", "resources": {"requests": {"elasticgpu.io/gpu-core": -10}}},
     ["spec.resources.requests[elasticgpu.io/gpu-core]: Invalid value", "whole number >= 0"]),
    ({"egpuClassName": "c", "resources": {"requests": {"elasticgpu.io/gpu-memory": "4Gi"}}},
     ["spec.resources.requests[elasticgpu.io/gpu-memory]: Invalid value",
      "no sign, fraction or byte suffix"]),
    ({"egpuClassName": "c", "resources": {"requests": {"cpu": 1}}},
     ["spec.resources.requests", "GPU resource name of Elastic GPU's resource table"]),
    ({"egpuClassName": "c", "resources": {"requests": {}}},
     ["spec.resources.requests: Invalid value", "should have at least 1 properties"]),
    ({"egpuClassName": "c", "resources": {}}, ["spec.resources.requests: Required value"]),
    ({"egpuClassName": "Bad_Name", "resources": {"requests": GOOD_REQUESTS}},
     ["spec.egpuClassName: Invalid value"]),
])
def test_nonsense_claims_are_refused(crds: Any, k8s_namespace: str, spec: dict[str, Any],
                                     words: list[str]) -> None:
    result = crds.kubectl("create", "-n", k8s_namespace, "-f", "-",
                          input=_claim(unique_name("bad"), spec), check=False)
    assert result.returncode != 0, result.stdout
    for word in words:
        assert word in result.stderr, result.stderr


def test_mig_and_quantity_strings_are_accepted(crds: Any, k8s_namespace: str) -> None:
    for requests in ({"nvidia.com/mig-1g.10gb": 2}, {"elasticgpu.io/gpu-memory": "4k"},
                     {"nvidia.com/gpu": "2"}):
        crds.kubectl("create", "-n", k8s_namespace, "-f", "-",
                     input=_claim(unique_name("ok"), {"egpuClassName": "c",
                                                      "resources": {"requests": requests}}))


def test_immutable_fields_cannot_change(crds: Any, k8s_namespace: str) -> None:
    cls = unique_name("imm")
    crds.kubectl("create", "-f", "-", input=_class(cls, provisioner=GPUSHARE))
    try:
        result = crds.kubectl("patch", "egpuclass", cls, "--type=merge", "-p",
                              '{"reclaimPolicy": "Retain"}', check=False)
        assert result.returncode != 0 and "reclaimPolicy is immutable" in result.stderr
        result = crds.kubectl("patch", "egpuclass", cls, "--type=merge", "-p",
                              '{"parameters": {"models": "A100"}}', check=False)
        assert result.returncode != 0 and "parameters is immutable" in result.stderr
    finally:
        crds.kubectl("delete", "egpuclass", cls)
    claim = unique_name("imm")
    crds.kubectl("create", "-n", k8s_namespace, "-f", "-",
                 input=_claim(claim, {"egpuClassName": cls, "resources": {"requests": GOOD_REQUESTS}}))
    result = crds.kubectl("patch", "egpuc", claim, "-n", k8s_namespace, "--type=merge", "-p",
                          '{"spec": {"resources": {"requests": {"elasticgpu.io/gpu-core": 20}}}}',
                          check=False)
    assert result.returncode != 0 and "spec.resources is immutable" in result.stderr
    # binding sets spec.elasticGPUName once; changing it afterwards is refused
    crds.kubectl("patch", "egpuc", claim, "-n", k8s_namespace, "--type=merge", "-p",
                 '{"spec": {"elasticGPUName": "egpu-a"}}')
    result = crds.kubectl("patch", "egpuc", claim, "-n", k8s_namespace, "--type=merge", "-p",
                          '{"spec": {"elasticGPUName": "egpu-b"}}', check=False)
    assert result.returncode != 0 and "cannot be changed or removed" in result.stderr


def test_status_phase_is_an_enum(crds: Any, k8s_namespace: str) -> None:
    claim = unique_name("phase")
    crds.kubectl("create", "-n", k8s_namespace, "-f", "-",
                 input=_claim(claim, {"egpuClassName": "c", "resources": {"requests": GOOD_REQUESTS}}))
    result = crds.kubectl("patch", "egpuc", claim, "-n", k8s_namespace, "--subresource=status",
                          "--type=merge", "-p", '{"status": {"phase": "Happy"}}', check=False)
    assert result.returncode != 0 and 'status.phase: Unsupported value: "Happy"' in result.stderr


def test_kubectl_get_prints_the_columns(crds: Any, k8s_namespace: str) -> None:
    cls_name, claim_name = unique_name("cols"), unique_name("cols")
    crds.kubectl("create", "-f", "-", input=_class(cls_name, provisioner=GPUSHARE,
                                                   reclaimPolicy="Retain"))
    crds.kubectl("create", "-n", k8s_namespace, "-f", "-", input=_claim(
        claim_name, {"egpuClassName": cls_name, "resources": {"requests": GOOD_REQUESTS}}))
    claim_obj = json.loads(crds.kubectl("get", "egpuc", claim_name, "-n", k8s_namespace,
                                        "-o", "json").stdout)
    claim = api.claim_from_object(claim_obj)
    # what the controller will write, built by the core and the API layer
    egpu = ElasticGPU(
        name=provisioned_name(claim), capacity=dict(GOOD_REQUESTS), node="node-a",
        shares=(CardShare(3, "GPU-3", 100, 0),), claim_ref=ClaimRef.of(claim),
        class_name=cls_name, reclaim_policy=ReclaimPolicy.RETAIN, phase=ElasticGPUPhase.BOUND)
    obj = api.elasticgpu_to_object(egpu)
    try:
        crds.kubectl("create", "-f", "-", input=json.dumps(obj))
        crds.kubectl("patch", "egpu", egpu.name, "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": obj["status"]}))
        # the status the API layer builds for a Bind is accepted by the schema as it is
        status = api.claim_status(claim_decisions.Bind(egpu.name), claim_obj, "2026-01-01T00:00:00Z", egpu)
        crds.kubectl("patch", "egpuc", claim_name, "-n", k8s_namespace, "--subresource=status",
                     "--type=merge", "-p", json.dumps({"status": status}))
        stored_claim = json.loads(crds.kubectl("get", "egpuc", claim_name, "-n", k8s_namespace,
                                               "-o", "json").stdout)
        assert stored_claim["status"] == status
        stored = json.loads(crds.kubectl("get", "egpu", egpu.name, "-o", "json").stdout)
        assert api.elasticgpu_from_object(stored) == egpu  # round trip through the API
        out = crds.kubectl("get", "egpuclass,egpuc,egpu", "-n", k8s_namespace).stdout
        lines = out.splitlines()
        headers = [line.split() for line in lines if line.startswith("NAME")]
        assert ["NAME", "PROVISIONER", "RECLAIMPOLICY", "BINDINGMODE", "AGE"] in headers
        assert ["NAME", "STATUS", "ELASTICGPU", "CAPACITY", "CLASS", "NODE", "AGE"] in headers
        assert ["NAME", "CAPACITY", "NODE", "CARDS", "RECLAIMPOLICY", "STATUS", "CLAIM", "CLASS",
                "AGE"] in headers
        # this test's own row: the cluster is shared, other tests' ElasticGPUs may be listed
        row = next(line.split() for line in lines
                   if line.startswith(f"elasticgpu.{api.GROUP}/{egpu.name} "))
        assert row[2:7] == ["node-a", "3", "Retain", "Bound", claim_name], out
        claim_row = next(line.split() for line in lines
                         if line.startswith(f"elasticgpuclaim.{api.GROUP}/{claim_name}"))
        assert claim_row[1:3] == ["Bound", egpu.name] and claim_row[4:6] == [cls_name, "node-a"], out
        print(out)
    finally:
        crds.kubectl("delete", "egpu", egpu.name, "--ignore-not-found")
        crds.kubectl("delete", "egpuclass", cls_name)


def test_the_installer_is_idempotent_and_waits_until_served(k8s_cluster: Any) -> None:
    from elastic_gpu.kube.crds import install_elasticgpu_crds

    client = k8s_cluster.kube()
    install_elasticgpu_crds(client)
    install_elasticgpu_crds(client)  # again: an update, not an error
    for short in (api.CLASS_SHORT, api.CLAIM_SHORT, api.EGPU_SHORT):
        assert k8s_cluster.kubectl("get", short, "-A", check=False).returncode == 0
    stored = json.loads(k8s_cluster.kubectl("get", "crd", "elasticgpuclaims.elasticgpu.io",
                                            "-o", "json").stdout)
    assert stored["spec"]["names"]["shortNames"] == ["egpuc"]
