"""Issue #15, must-show 3: the controller and the extender SIGKILLed in the middle of 500
claims and their 500 pods being created; afterwards, read back from the API with none of
their code (egpu_testing.claims_burst): no card over capacity counting pods and ElasticGPUs
together, no claim bound twice, none lost, and every claim that fits is bound.

Half of the claims are Immediate (the controller asks the extender to provision them when
they are created), half WaitForFirstConsumer (the extender provisions them when it binds
their pod), so both provisioning paths are cut in the middle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.claims_burst import check_claims, claim_manifests, consumer_pod, register_kinds
from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.scenario import create_pods, list_pods
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.devcluster.nodes import fake_inventory
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

NODES = 10
CLAIMS = 500  # ~145 cards of share asked of 80: the cluster fills, the rest stays Pending


@pytest.fixture
def system(k8s_cluster: Any, tmp_path: Path) -> Iterator[tuple[ExtenderProcess, ControllerProcess]]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    install_crds(k8s_cluster)
    register_kinds()
    (port, metrics) = free_ports(2)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log")
    extender.start()
    controller = ControllerProcess(k8s_cluster.kubeconfig, metrics, tmp_path / "controller.log",
                                   extender_url=extender.url, identity=unique_name("ctl"),
                                   lease_name=unique_name("claims-restart"))
    controller.start()
    yield extender, controller
    controller.stop()
    extender.stop()


def _classes(k8s_cluster: Any) -> list[str]:
    names = []
    for mode in ("Immediate", "WaitForFirstConsumer"):
        name = unique_name(mode.lower()[:4])
        k8s_cluster.kubectl("create", "-f", "-", input=(
            f"apiVersion: {api.API_VERSION}\nkind: {api.CLASS_KIND}\nmetadata: {{name: {name}}}\n"
            f"provisioner: gpushare.provisioner.elasticgpu.io\nreclaimPolicy: Delete\n"
            f"egpuBindingMode: {mode}\n"))
        names.append(name)
    return names


def _list(k8s_cluster: Any, kind: str, namespace: str | None) -> list[dict[str, Any]]:
    import json

    args = ["get", kind, "-o", "json"] + (["-n", namespace] if namespace else [])
    return list(json.loads(k8s_cluster.kubectl(*args).stdout)["items"])


def test_sigkill_controller_and_extender_in_the_middle_of_500_claims(
        k8s_cluster: Any, system: tuple[ExtenderProcess, ControllerProcess],
        start_kube_scheduler: Callable[..., Any], fake_gpu_nodes: Callable[..., list[str]],
        k8s_namespace: str) -> None:
    extender, controller = system
    node_names = fake_gpu_nodes(NODES, gpus=8)
    nodes = [fake_inventory(name, gpus=8) for name in node_names]
    scheduler = extender.scheduler_name
    start_kube_scheduler(extender_kube_scheduler_config(extender.url, scheduler))
    classes = _classes(k8s_cluster)
    claims = claim_manifests(CLAIMS, k8s_namespace, classes, seed=7)
    # claim i, then its pod: both kinds of object arrive all through the burst
    objects: list[dict[str, Any]] = []
    for claim in claims:
        objects += [claim, consumer_pod(claim, scheduler)]
    client = k8s_cluster.client()
    creator = threading.Thread(target=create_pods, args=(client, objects), daemon=True)
    started = time.monotonic()
    creator.start()

    killed_at: list[int] = []
    last_change, last_bound = time.monotonic(), -1
    while True:
        listed = _list(k8s_cluster, "egpuc", k8s_namespace)
        bound = sum(1 for c in listed if (c.get("status") or {}).get("phase") == "Bound")
        if not killed_at and bound >= 60:
            controller.kill()
            extender.kill()
            killed_at.append(bound)
            extender.start()  # fresh processes: all they know comes from listing the API
            controller.start()
        now = time.monotonic()
        if bound != last_bound:
            last_bound, last_change = bound, now
        if not creator.is_alive() and (now - last_change >= 25 or now - started > 600):
            break
        time.sleep(1.0)

    claims_now = _list(k8s_cluster, "egpuc", k8s_namespace)
    ours = set(node_names)
    egpus = [e for e in _list(k8s_cluster, "egpu", None)
             if (e.get("spec") or {}).get("node") in ours]
    pods = list_pods(client, k8s_namespace)
    report = check_claims(claims_now, egpus, pods, nodes)
    print(f"killed at {killed_at[0] if killed_at else None} Bound; {report.summary()}")
    logs = f"\n{extender.log_tail()}\n{controller.log_tail()}"
    assert len(claims_now) == CLAIMS and len(pods) == CLAIMS, report.summary()
    assert killed_at and killed_at[0] < report.bound, (killed_at, report.summary())
    assert report.ok, report.summary() + logs
    assert report.bound >= 200, report.summary()  # the cards really filled up
    # every bound claim's pod is bound too (the pods of pending claims wait for them)
    assert report.pods_bound == report.bound, report.summary() + logs
