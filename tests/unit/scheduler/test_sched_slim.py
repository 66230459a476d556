"""The API worker's slim objects keep everything the scheduler reads, and drop only changes
that move no card."""

from __future__ import annotations

import copy
import json
from typing import Any

from elastic_gpu.api import gpudevice
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.dra.podclaims import claim_refs
from elastic_gpu.core.model import Card, Link, LinkKind
from elastic_gpu.core.request import pod_host_requests, pod_request_from_manifest
from elastic_gpu.kube.transport import WatchDecoder
from elastic_gpu.scheduler.app import node_info
from elastic_gpu.scheduler.slim import ChangeFilter, ListedPod, slim_device, slim_node, slim_pod
from elastic_gpu.scheduler.state import PodInfo


def full_pod(phase: str = "Running", node: str = "n1") -> dict[str, Any]:
    assignment = Assignment(node=node, containers={"main": (CardShare(2, "GPU-2", 250, 4096),)})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
            "labels": {"app": "x"}, "creationTimestamp": "2026-11-21T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            "annotations": {ann.ASSIGNMENT: assignment.to_json(), ann.ASSIGNED_NODE: node,
                            ann.GPU_MODEL_ALLOW: "A100|H100", ann.NODE_POLICY: "spread",
                            ann.CARD_POLICY: "binpack"},
        },
        "spec": {
            "nodeName": node, "priority": 7, "schedulerName": "egpu",
            "containers": [
                {"name": "main", "image": "busybox", "command": ["sleep"],
                 "resources": {"limits": {"elasticgpu.io/gpu-core": "25",
                                          "elasticgpu.io/gpu-memory": "4096"},
                               "requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "side", "image": "busybox", "resources": {"requests": {"cpu": "1"}}},
            ],
            "initContainers": [{"name": "init", "image": "busybox",
                                "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "overhead": {"cpu": "250m", "memory": "120Mi"},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "whole"}],
        },
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}],
                   "podIP": "10.0.0.1"},
    }


def test_a_slim_pod_reads_exactly_like_the_full_one() -> None:
    full = full_pod()
    slim = slim_pod(full)
    assert pod_request_from_manifest(slim) == pod_request_from_manifest(full)
    # max(0.5 + 1 CPU, init 2 CPU) + 0.25 overhead; max(1 GiB, init 2 GiB) + 120 MiB
    assert pod_host_requests(slim) == pod_host_requests(full) == (2250, 2168)
    a, b = PodInfo.from_manifest(slim), PodInfo.from_manifest(full)
    assert (a.uid, a.namespace, a.name, a.node_name, a.resource_version, a.priority,
            a.assignment, a.assignment_error, a.holds) == \
           (b.uid, b.namespace, b.name, b.node_name, b.resource_version, b.priority,
            b.assignment, b.assignment_error, b.holds)
    assert "managedFields" not in slim["metadata"] and "volumes" not in slim["spec"]
    # the bind takes a claim pod on a DRA node by its claims (`extender_binds`)
    assert claim_refs(slim) == claim_refs(full) != []


def test_a_terminal_phase_survives_and_a_running_one_does_not() -> None:
    failed = PodInfo.from_manifest(slim_pod(full_pod(phase="Failed")))
    assert failed.phase == "Failed" and failed.holds is None
    running = slim_pod(full_pod(phase="Running"))
    assert running["status"] == {}
    assert PodInfo.from_manifest(running).holds is not None


def test_a_slim_node_and_device_read_like_the_full_ones() -> None:
    node = {"metadata": {"name": "n1", "labels": {"gpu": "a100"}, "resourceVersion": "9",
                         "managedFields": [{}]},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi"},
                       "capacity": {"cpu": "64", "memory": "256Gi"},
                       "conditions": [{"type": "Ready"}], "images": [{"names": ["x"]}]}}
    assert node_info(slim_node(node)) == node_info(node)
    card = Card(index=3, uuid="GPU-3", model="A100", memory_mib=81920,
                links=(Link(2, LinkKind.NVLINK, 4),), numa_node=1)
    device = gpudevice.card_to_object("n1", card)
    device["metadata"].update(resourceVersion="5", managedFields=[{}])
    assert gpudevice.card_from_object(slim_device(device)) == gpudevice.card_from_object(device)


def test_change_filter_drops_what_moves_no_card() -> None:
    changes = ChangeFilter()
    bound = slim_pod(full_pod())
    changes.replace([bound])
    # kwok/kubelet status churn on a bound pod: only the resourceVersion moves in slim form
    churn = copy.deepcopy(bound)
    churn["metadata"]["resourceVersion"] = "43"
    assert not changes.changed("MODIFIED", churn)
    # an unbound pod's version is a bind precondition: always passed on
    pending = slim_pod(full_pod(node=""))
    pending["spec"].pop("nodeName")
    assert changes.changed("ADDED", pending)
    again = copy.deepcopy(pending)
    again["metadata"]["resourceVersion"] = "44"
    assert changes.changed("MODIFIED", again)
    # termination and deletion always pass
    done = slim_pod(full_pod(phase="Succeeded"))
    assert changes.changed("MODIFIED", done)
    assert changes.changed("DELETED", done)
    # a node whose status heartbeat changed nothing we read
    nodes = ChangeFilter()
    n = slim_node({"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "8"}}})
    nodes.replace([n])
    assert not nodes.changed("MODIFIED", copy.deepcopy(n))
    assert nodes.changed("MODIFIED", slim_node({"metadata": {"name": "n1"},
                                                "status": {"allocatable": {"cpu": "4"}}}))


def test_slim_elastic_gpu_api_objects_read_like_full_ones() -> None:
    from egpu_testing.claims import claim_object, class_object, elasticgpu_object
    from elastic_gpu.api import elasticgpu as api
    from elastic_gpu.scheduler.slim import slim_claim, slim_class, slim_elasticgpu

    noise = {"managedFields": [{"manager": "kubectl"}], "labels": {"a": "b"},
             "creationTimestamp": "2026-11-21T00:00:00Z"}
    egpu = elasticgpu_object("e1", "n1", [CardShare(0, "GPU-0", 300, 1024)], phase="Released",
                             claim=("ns", "c", "u"), class_name="share", uid="obj-1")
    egpu["metadata"].update(noise)
    egpu["status"].update({"reason": "x", "message": "y"})
    assert api.elasticgpu_from_object(slim_elasticgpu(egpu)) == api.elasticgpu_from_object(egpu)
    assert slim_elasticgpu(egpu)["metadata"]["uid"] == "obj-1"
    claim = claim_object("c", {"elasticgpu.io/gpu-core": 10}, namespace="ns", uid="u",
                         elastic_gpu="e1", phase="Bound")
    claim["metadata"].update(noise, deletionTimestamp="2026-11-21T00:00:01Z")
    claim["status"]["conditions"] = [{"type": "Bound", "status": "True"}]
    assert api.claim_from_object(slim_claim(claim)) == api.claim_from_object(claim)
    assert api.claim_from_object(slim_claim(claim)).deleting
    cls = class_object("share", mode="WaitForFirstConsumer", reclaim="Retain",
                       parameters={"models": "T4"})
    cls["metadata"].update(noise)
    assert api.class_from_object(slim_class(cls)) == api.class_from_object(cls)
    # a condition's churn on a claim changes nothing the extender reads
    changes = ChangeFilter()
    changes.replace([slim_claim(claim)])
    churned = copy.deepcopy(claim)
    churned["status"]["conditions"][0]["message"] = "again"
    churned["metadata"]["resourceVersion"] = "99"
    assert not changes.changed("MODIFIED", slim_claim(churned))


def test_a_deleted_pods_container_states_survive_and_free_its_cards_once_stopped() -> None:
    pod = full_pod()
    pod["metadata"]["deletionTimestamp"] = "2026-11-28T15:00:00Z"
    pod["status"]["containerStatuses"] = [
        {"name": "main", "state": {"running": {"startedAt": "2026-11-28T14:00:00Z"}},
         "restartCount": 0},
        {"name": "side", "state": {"terminated": {"exitCode": 0}}}]
    assert PodInfo.from_manifest(slim_pod(pod)).holds is not None
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 137}}
    slim = slim_pod(pod)
    assert slim["status"]["containerStatuses"][0] == {"name": "main",
                                                      "state": {"terminated": {}}}
    assert PodInfo.from_manifest(slim).stopped and PodInfo.from_manifest(slim).holds is None
    assert PodInfo.from_manifest(pod).stopped


def _listed(obj: dict[str, Any], shape: Any) -> dict[str, Any]:
    """`obj` as a list page decodes it with `shape` (`RestClient.list_pages`)."""
    import msgspec

    listed: dict[str, Any] = msgspec.to_builtins(msgspec.json.decode(msgspec.json.encode(obj),
                                                                     type=shape))
    return listed


def test_a_listed_shape_slims_exactly_like_the_full_object() -> None:
    from elastic_gpu.scheduler.slim import ListedDevice, ListedNode, ListedPod

    deleting = full_pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-28T15:00:00Z"
    deleting["status"]["containerStatuses"] = [
        {"name": "main", "state": {"terminated": {"exitCode": 0}}, "restartCount": 0}]
    deleting["status"]["initContainerStatuses"] = [{"name": "init", "state": {}}]
    affine = full_pod(node="")
    affine["spec"].update(nodeSelector={"a": "b"}, tolerations=[{"key": "k"}], affinity={
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": []}}, "podAffinity": {"x": 1}})
    bare: dict[str, Any] = {"metadata": {"name": "b"}, "spec": {"containers": [{}]}}
    assert "managedFields" not in _listed(full_pod(), ListedPod)["metadata"]  # it drops
    for pod in (full_pod(), full_pod(phase="Failed"), deleting, affine, bare):
        assert slim_pod(_listed(pod, ListedPod)) == slim_pod(pod)
    node = {"metadata": {"name": "n1", "labels": {"a": "b"}, "uid": "x",
                         "managedFields": [{}]},
            "spec": {"taints": [{"key": "t", "effect": "NoSchedule"}], "podCIDR": "x"},
            "status": {"allocatable": {"cpu": "8"}, "capacity": {"cpu": "8"},
                       "images": [{"names": ["a"]}], "conditions": [{"type": "Ready"}]}}
    assert slim_node(_listed(node, ListedNode)) == slim_node(node)
    assert slim_node(_listed({"metadata": {"name": "n2"}}, ListedNode)) == slim_node(
        {"metadata": {"name": "n2"}})
    card = Card(index=1, uuid="GPU-1", model="A100", memory_mib=81920, numa_node=1)
    device = gpudevice.card_to_object("n1", card)
    device["metadata"].update(resourceVersion="5", managedFields=[{}], uid="x")
    assert slim_device(_listed(device, ListedDevice)) == slim_device(device)


def test_pod_level_resources_survive_the_slim_form_and_the_wire() -> None:
    from elastic_gpu.scheduler import wire

    full = full_pod()
    full["spec"]["resources"] = {"requests": {"cpu": "8", "memory": "4Gi"}}
    args = wire.parse_args(json.dumps({"Pod": full, "NodeNames": ["n1"]}).encode())
    # pod level replaces the containers' max(1.5, 2) CPU and max(1, 2) GiB; overhead on top
    assert pod_host_requests(slim_pod(full)) == pod_host_requests(args.Pod) == (8250, 4216)


def test_a_watched_event_decodes_into_its_feeds_shape_and_slims_like_the_full_object(
) -> None:
    import msgspec

    from elastic_gpu.kube.transport import WatchDecoder
    from elastic_gpu.scheduler.apiworker import SHAPES

    node = {"metadata": {"name": "n1", "labels": {"a": "b"}, "resourceVersion": "8",
                         "managedFields": [{}]},
            "spec": {"taints": [{"key": "t", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "8"}, "capacity": {"cpu": "8"},
                       "images": [{"names": ["a"]}], "conditions": [{"type": "Ready"}]}}
    card = Card(index=1, uuid="GPU-1", model="A100", memory_mib=81920, numa_node=1)
    device = gpudevice.card_to_object("n1", card)
    device["metadata"].update(resourceVersion="5", managedFields=[{}])
    for feed, obj, slim in (("pods", full_pod(), slim_pod), ("nodes", node, slim_node),
                            ("gpudevices", device, slim_device)):
        line = msgspec.json.encode({"type": "MODIFIED", "object": obj})
        kind, watched = WatchDecoder(SHAPES[feed])(line)
        assert kind == "MODIFIED" and slim(watched) == slim(obj)
        assert "managedFields" not in watched["metadata"]  # never built
        # the reflector watches on from the newest version an event carried
        assert watched["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


def test_a_pod_bookmark_as_kube_apiserver_writes_it_decodes_through_the_pod_shape() -> None:
    """A BOOKMARK's object is an empty Pod whose `spec.containers` is null (Go's nil slice):
    the watch must move its version on, not fail (a failed watch relists every pod)."""
    line = (b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":'
            b'{"resourceVersion":"4711","creationTimestamp":null,"annotations":'
            b'{"k8s.io/initial-events-end":"true"}},"spec":{"containers":null},"status":{}}}')
    kind, obj = WatchDecoder(ListedPod)(line)
    assert kind == "BOOKMARK" and obj["metadata"]["resourceVersion"] == "4711"
    assert slim_pod(obj)["metadata"]["resourceVersion"] == "4711"
