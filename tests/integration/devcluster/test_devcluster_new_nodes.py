"""`create_fake_node` (loading a new cluster, no reads) publishes exactly what
`register_fake_node` (the agent's reconciling path) does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from egpu_testing.pytest_plugin import unique_name
from elastic_gpu.api.gpudevice import NODE_LABEL
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.nodes import (
    create_fake_node,
    fake_inventory,
    register_fake_node,
    register_fake_nodes,
    unregister_fake_node,
)
from elastic_gpu.kube.errors import Conflict
from elastic_gpu.kube.resources import GPUDEVICES, NODES

pytestmark = pytest.mark.integration


#: Labels kube-controller-manager's node lifecycle controller copies from the stable ones
#: (`reconcileNodeLabels`), whenever it gets to the node: not the publishing's.
CONTROLLER_LABELS = frozenset({"beta.kubernetes.io/arch", "beta.kubernetes.io/os"})


def _published(plane: ControlPlane, name: str) -> dict[str, Any]:
    """What the node's publishing wrote, the node's name replaced by NODE and what the API
    server, kwok or kube-controller-manager fills in (uids, versions, timestamps, heartbeats,
    kwok's status, the beta labels) left out."""
    kube = plane.kube()
    node = kube.get(NODES.path(name=name))
    labels = {k: v for k, v in node["metadata"]["labels"].items() if k not in CONTROLLER_LABELS}
    devices, _ = kube.list(GPUDEVICES.path(), {"labelSelector": f"{NODE_LABEL}={name}"})
    uid = node["metadata"]["uid"]
    written = {
        "node": {"labels": labels,
                 "annotations": node["metadata"].get("annotations"),
                 "capacity": node["status"]["capacity"],
                 "allocatable": node["status"]["allocatable"]},
        "devices": sorted(({"name": d["metadata"]["name"], "labels": d["metadata"]["labels"],
                            "owners": d["metadata"].get("ownerReferences"), "spec": d["spec"],
                            "status": {k: v for k, v in d["status"].items()
                                       if k != "lastHeartbeat"}} for d in devices),
                          key=lambda d: str(d["name"])),
    }
    return json.loads(json.dumps(written).replace(uid, "UID").replace(name, "NODE"))  # type: ignore[no-any-return]


@pytest.mark.parametrize("config", [None, {"timeSlicing": {"replicas": 4}}])
def test_a_node_created_outright_is_published_as_the_agent_publishes_it(
        k8s_cluster: ControlPlane, config: dict[str, Any] | None) -> None:
    kube = k8s_cluster.kube()
    agent, new = unique_name("agent"), unique_name("new")
    try:
        register_fake_node(kube, fake_inventory(agent, gpus=3), config)
        create_fake_node(kube, fake_inventory(new, gpus=3), config)
        published = _published(k8s_cluster, new)
        assert len(published["devices"]) == 3
        assert published == _published(k8s_cluster, agent)
        with pytest.raises(Conflict):  # outright: a node that exists is not reconciled
            create_fake_node(kube, fake_inventory(new, gpus=3), config)
    finally:
        unregister_fake_node(kube, agent)
        unregister_fake_node(kube, new)


def test_registering_new_nodes_in_bulk_creates_each_with_its_cards(
        k8s_cluster: ControlPlane) -> None:
    kube = k8s_cluster.kube()
    names = [unique_name("bulk") for _ in range(5)]
    try:
        assert register_fake_nodes(kube, [fake_inventory(n, gpus=2) for n in names],
                                   parallelism=4, new=True) == 5
        for name in names:
            assert len(_published(k8s_cluster, name)["devices"]) == 2
    finally:
        for name in names:
            unregister_fake_node(kube, name)
