"""Requests in TFLOPS on a real control plane (issue 28): the extender beside the real
kube-scheduler, fake (kwok) nodes of two card models. One request of N TFLOPS, as a claim and
as a pod, gets the share that gives N TFLOPS on each model (ceil(N / card's TFLOPS * 1000)
milli); a model outside the TFLOPS table turns the pod away with that reason.

Pods are created with their resources as the admission webhook leaves them (it adds nothing to
a TFLOPS request but the node-level count, which is 0 for it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import claim_object, class_object, get_json, install_crds
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import (
    create_pods,
    unschedulable_reason,
    wait_bound,
    wait_extender_knows,
)
from egpu_testing.workbench import ExtenderProcess, pod_manifest, running_extender
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.resources import GPU_TFLOPS
from elastic_gpu.core.tflops import share_milli

pytestmark = pytest.mark.integration

A100 = "A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
TFLOPS = 100


@pytest.fixture
def extender(k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path
             ) -> Iterator[ExtenderProcess]:
    install_crds(k8s_cluster)
    with running_extender(k8s_cluster, tmp_path, kube_scheduler=start_kube_scheduler) as process:
        yield process


def provision(url: str, claim: dict[str, Any]) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    meta = claim["metadata"]
    body = {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}
    request = urllib.request.Request(f"{url}/provision", data=json.dumps(body).encode(),
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_n_tflops_get_the_right_share_on_two_card_models(
        k8s_cluster: Any, extender: ExtenderProcess, k8s_namespace: str,
        fake_gpu_nodes: Callable[..., list[str]]) -> None:
    (a100,) = fake_gpu_nodes(1, gpus=1, gpu_model=A100, gpu_memory_mib=81920, prefix="a100")
    (h100,) = fake_gpu_nodes(1, gpus=1, gpu_model=H100, gpu_memory_mib=81920, prefix="h100")
    (g2,) = fake_gpu_nodes(1, gpus=1, gpu_model="G2", prefix="g2")
    wait_extender_knows(extender.url, [a100, h100, g2], 1)
    expected = {a100: share_milli(A100, TFLOPS), h100: share_milli(H100, TFLOPS)}
    assert expected == {a100: 321, h100: 102}
    client = k8s_cluster.client()
    classes: list[str] = []
    provisioned: list[str] = []
    try:
        # claims: one class per model; each claim of 100 TFLOPS is provisioned on its model
        for node, model in ((a100, A100), (h100, H100)):
            cls = unique_name("tflops")
            classes.append(cls)
            k8s_cluster.kubectl("create", "-f", "-", input=json.dumps(
                class_object(cls, parameters={"models": model})))
            claim = json.loads(k8s_cluster.kubectl(
                "create", "-o", "json", "-f", "-", input=json.dumps(claim_object(
                    f"c-{cls}", {GPU_TFLOPS: TFLOPS}, namespace=k8s_namespace,
                    class_name=cls))).stdout)
            status, answer = provision(extender.url, claim)
            assert (status, answer.get("result"), answer.get("node")) == (
                200, "Provisioned", node), extender.log_tail()
            provisioned.append(answer["elasticGPU"])
            egpu = api.elasticgpu_from_object(get_json(k8s_cluster, "egpu", answer["elasticGPU"]))
            assert [s.milli for s in egpu.shares] == [expected[node]]

        # pods: the same request, allowed one model each, bound by the real kube-scheduler
        pods = [pod_manifest(f"p-{i}", k8s_namespace, limits={GPU_TFLOPS: str(TFLOPS)},
                             annotations={ann.GPU_MODEL_ALLOW: model},
                             scheduler_name=extender.scheduler_name)
                for i, model in enumerate((A100, H100))]
        pods.append(pod_manifest("p-g2", k8s_namespace, limits={GPU_TFLOPS: "10"},
                                 annotations={ann.GPU_MODEL_ALLOW: "G2"},
                                 scheduler_name=extender.scheduler_name))
        create_pods(client, pods)
        bound = wait_bound(client, k8s_namespace, ["p-0", "p-1"])
        for name, node in (("p-0", a100), ("p-1", h100)):
            pod = bound[name]
            assert pod["spec"]["nodeName"] == node
            assignment = Assignment.from_json(pod["metadata"]["annotations"][ann.ASSIGNMENT])
            assert [s.milli for s in assignment.containers["main"]] == [expected[node]]
        reason = unschedulable_reason(client, k8s_namespace, "p-g2")
        assert "no model in the TFLOPS table" in reason, reason
    finally:
        for cls in classes:
            k8s_cluster.kubectl("delete", "egpuclaim", f"c-{cls}", "-n", k8s_namespace,
                                "--ignore-not-found", "--wait=false", check=False)
            k8s_cluster.kubectl("delete", "egpuclass", cls, "--ignore-not-found", check=False)
        if provisioned:  # only this test's: the cluster is shared by the session
            k8s_cluster.kubectl("delete", "egpu", *provisioned, "--ignore-not-found",
                                "--wait=false", check=False)
