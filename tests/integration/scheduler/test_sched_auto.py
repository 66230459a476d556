"""`filterResult: auto` (the default) beside the real kube-scheduler: a pod that states a soft
preference keeps it (kube-scheduler weighs its preferred node affinity with our scores), a plain
GPU pod goes where the engine says (docs/scheduler.md, "One round trip per pod")."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.scenario import create_pods, wait_bound, wait_extender_knows
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config, pod_manifest
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration


def named(node: str) -> dict[str, Any]:
    """A node selector term matching one node by name (the API takes one value there)."""
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}


def test_auto_keeps_a_stated_preference_and_places_a_plain_pod_by_the_engine(
        k8s_cluster: Any, start_kube_scheduler: Callable[..., Any], tmp_path: Path,
        fake_gpu_nodes: Callable[..., list[str]], k8s_namespace: str) -> None:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    client = k8s_cluster.client()
    (port,) = free_ports(1)
    # no filterResult: the default is auto; binpack: the engine prefers the fuller node
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log",
                               config={"nodePolicy": "binpack"})
    extender.start()
    try:
        name = extender.scheduler_name
        # deploy/'s configuration: prioritizeVerb kept, for the pods auto answers with all
        start_kube_scheduler(extender_kube_scheduler_config(extender.url, name))
        nodes = fake_gpu_nodes(2, gpus=8)
        wait_extender_knows(extender.url, nodes, 8, 30.0)

        def pod(pod_name: str, preferred: str | None = None) -> dict[str, Any]:
            manifest = pod_manifest(pod_name, k8s_namespace, limits={"nvidia.com/gpu": "1"},
                                    scheduler_name=name)
            # only this test's nodes (a hard rule: it narrows the candidates, states nothing soft)
            affinity: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [named(n) for n in nodes]}}
            if preferred is not None:
                affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
                    {"weight": 100, "preference": named(preferred)}]
            manifest["spec"]["affinity"] = {"nodeAffinity": affinity}
            return manifest

        def filter_answer(manifest: dict[str, Any]) -> list[str]:
            body = json.dumps({"Pod": manifest, "NodeNames": nodes}).encode()
            request = urllib.request.Request(f"{extender.url}/filter", data=body, method="POST")
            with urllib.request.urlopen(request, timeout=10) as response:
                names: list[str] = json.loads(response.read())["NodeNames"]
            return names

        def place(manifest: dict[str, Any]) -> str:
            create_pods(client, [manifest])
            pod_name = manifest["metadata"]["name"]
            node: str = wait_bound(client, k8s_namespace, [pod_name])[pod_name]["spec"]["nodeName"]
            return node

        # empty nodes score alike: the engine's seeded rank breaks the tie, and filter
        # answers a plain GPU pod with that one node
        (chosen,) = filter_answer(pod("probe"))
        other = next(n for n in nodes if n != chosen)
        # a pod preferring the other node keeps its preference: filter answers both, and
        # kube-scheduler adds its NodeAffinity score (100 x weight 2) to the extender's equal
        # ones (10 x weight 5 x 10 each), so the preferred node wins (with `best` it would
        # have gone to `chosen`)
        preferring = pod("preferring", preferred=other)
        assert sorted(filter_answer(preferring)) == sorted(nodes)
        assert place(preferring) == other
        # binpack now prefers the fuller node, `other`: a plain pod goes where the engine says,
        # one node answered and bound
        plain = pod("plain")
        assert filter_answer(plain) == [other]
        assert place(plain) == other
    finally:
        extender.stop()
