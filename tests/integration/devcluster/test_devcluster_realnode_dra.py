"""The agent in DRA mode (fake backend) beside a real kubelet: kubelet's plugin watcher
registers the DRA plugin, the default kube-scheduler's DynamicResources plugin allocates a
claim of a card share from the agent's ResourceSlices, kubelet calls NodePrepareResources
before the container starts, follows the plugin's device health stream into the pod's status
(`allocatedResourcesStatus`), survives a kubelet restart (which deletes the node's slices: the
agent publishes them again when kubelet registers it again), and calls NodeUnprepareResources
after the pod goes.

The real node's containerd is 2.4 (built by hack/ensure-k8s.sh), which reads the agent's CDI
specs from the node's CDI directory: the container's environment is the share's grant, as the
device-plugin path's Allocate gives it (the container prints its environment). Skipped where
the machine cannot run a real node.

Issue 41's `dra-packed` path on the same node: the webhook gates a claim pod of our card class,
the extender's DRA allocator writes the claim's allocation (the API server's managedFields name
it, not kube-scheduler) and lifts the gate, kubelet prepares the claim and the container
prints the share's grant. The same for a claim of the MIG class (issue 42): our allocator takes
an instance of the fake inventory's carved card and the container prints that instance.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.dra import claim_manifest, env_of
from egpu_testing.webhook import running_webhook, wait_in_force
from egpu_testing.workbench import plain_kube_scheduler_config, running_extender
from elastic_gpu.agent.dra.cdi import spec_file
from elastic_gpu.agent.dra.slices_api import existing_slices
from elastic_gpu.api.config.strict_yaml import dump_yaml
from elastic_gpu.core.annotations import DRA_PLACEMENT_GATE
from elastic_gpu.core.dra.claim_placement import ALLOCATION_FINALIZER
from elastic_gpu.core.dra.classes import MIG_CLASS, device_classes
from elastic_gpu.core.dra.devices import DRIVER
from elastic_gpu.core.dra.nodemode import GPU_MODE_DRA, GPU_MODE_LABEL
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.process import ProcessHandle, spawn
from elastic_gpu.devcluster.realnode import REAL_NODE_TOLERATION, RealNode
from elastic_gpu.devcluster.realnode_agent import agent_argv, write_agent_files
from elastic_gpu.kube.errors import AlreadyExists, NotFound
from elastic_gpu.kube.resources import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS

pytestmark = pytest.mark.integration

INVENTORY: dict[str, Any] = {
    "cards": [*({"model": "A100-SXM4-80GB", "memoryMiB": 81920, "uuid": f"GPU-dra-{i}"}
                for i in range(2)),
              {"model": "A100-SXM4-80GB", "memoryMiB": 81920, "uuid": "GPU-dra-2",
               "mig": [{"profile": "3g.40gb", "uuid": "MIG-dra-2a", "start": 0},
                       {"profile": "3g.40gb", "uuid": "MIG-dra-2b", "start": 4}]}]}
REGISTERED = f"kubelet registered the DRA plugin {DRIVER}"
#: the namespace label the test's webhook is sent pods by
WEBHOOK_LABEL = "egpu-dra-realnode"


def tmp_agent_dir(agent: ProcessHandle) -> Path:
    """The directory `write_agent_files` wrote the agent's config and inventory into."""
    return agent.log_path.parent / "agent"


def wait_for(check: Callable[[], bool], what: str, agent: ProcessHandle,
             timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert agent.alive(), f"the agent died:\n{agent.log_tail()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s; agent log:\n" \
            f"{agent.log_tail()}"
        time.sleep(0.2)


@pytest.fixture
def dra_agent(real_node: RealNode, k8s_cluster: ControlPlane,
              tmp_path: Path) -> Iterator[tuple[ProcessHandle, Path]]:
    """The real node labelled for DRA, the DeviceClasses, and the agent in DRA mode serving
    kubelet's plugin directories; (the agent, its CDI directory)."""
    kube = k8s_cluster.kube()
    created = []
    for cls in device_classes():
        with contextlib.suppress(AlreadyExists):
            kube.create(DEVICE_CLASSES.path(), cls)
            created.append(cls["metadata"]["name"])
    k8s_cluster.kubectl("label", "node", real_node.name, "--overwrite",
                        f"{GPU_MODE_LABEL}={GPU_MODE_DRA}")
    root = real_node.paths.kubelet_root  # /var/lib/kubelet inside the node's namespace
    cdi = real_node.paths.cdi_dir  # where the node's containerd reads CDI specs
    config = write_agent_files(tmp_path / "agent", real_node.device_plugin_dir, INVENTORY, {
        "syncSeconds": 2, "deviceSpecs": False, "usage": {"enabled": False},
        "dra": {"enabled": True, "pluginDirectory": str(root / "plugins" / DRIVER),
                "registryDirectory": str(root / "plugins_registry"), "cdiDirectory": str(cdi)}})
    agent = spawn("agent", agent_argv(real_node.name, k8s_cluster.kubeconfig, config),
                  tmp_path / "agent.log", die_with_parent=True)
    try:
        # the real kubelet's plugin watcher found the socket, called GetInfo and accepted it
        wait_for(lambda: REGISTERED in agent.log_path.read_text(), "registration", agent)
        wait_for(lambda: bool(existing_slices(kube, real_node.name)), "ResourceSlices", agent)
        yield agent, cdi
    finally:
        agent.stop()
        k8s_cluster.kubectl("label", "node", real_node.name, f"{GPU_MODE_LABEL}-",
                            check=False)
        for name in created:
            with contextlib.suppress(NotFound):
                kube.delete(DEVICE_CLASSES.path(name=name))


def claim_user_pod(name: str, claim: str, real_node: RealNode,
                   command: str = "env; exec sleep 3600",
                   scheduler_name: str | None = None) -> dict[str, Any]:
    """A pod on the real node whose one container uses the ResourceClaim `claim`."""
    spec: dict[str, Any] = {
        "tolerations": [REAL_NODE_TOLERATION], "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"kubernetes.io/hostname": real_node.name},
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        "containers": [{"name": "main", "image": real_node.busybox_image,
                        "imagePullPolicy": "Never", "command": ["sh", "-c", command],
                        "resources": {"claims": [{"name": "gpu"}]}}]}
    if scheduler_name is not None:
        spec["schedulerName"] = scheduler_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pod_phase(kube: Any, namespace: str, name: str) -> str:
    """The pod's phase; a pod that ended fails the test at once, with its status."""
    status = kube.get(PODS.path(namespace=namespace, name=name)).get("status") or {}
    assert status.get("phase") not in ("Failed", "Succeeded"), status
    return str(status.get("phase"))


def test_kubelet_prepares_a_share_claim_allocated_by_kube_scheduler(
        dra_agent: tuple[ProcessHandle, Path], real_node: RealNode, k8s_cluster: ControlPlane,
        k8s_namespace: str) -> None:
    agent, cdi = dra_agent
    kube = k8s_cluster.kube()
    claim = kube.create(RESOURCE_CLAIMS.path(namespace=k8s_namespace), claim_manifest(
        "share", k8s_namespace, capacity={"compute": "30", "memory": "8Gi"}))
    uid = claim["metadata"]["uid"]
    kube.create(PODS.path(namespace=k8s_namespace), claim_user_pod("user", "share", real_node))

    def phase() -> str:
        return pod_phase(kube, k8s_namespace, "user")
    wait_for(lambda: phase() == "Running", "Running pod", agent)

    allocated = kube.get(RESOURCE_CLAIMS.path(namespace=k8s_namespace, name="share"))
    (result,) = allocated["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, real_node.name)
    assert result["device"] in ("gpu-0", "gpu-1")
    assert result["consumedCapacity"] == {"compute": "30", "memory": "8Gi"}
    # kubelet called NodePrepareResources: the claim's CDI spec holds Allocate's grant
    spec = json.loads(spec_file(cdi, uid).read_text())
    env = env_of(spec, f"{uid}-{result['device']}")
    index = int(result["device"].removeprefix("gpu-"))
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-dra-{index}"
    assert env["EGPU_CORE_PERCENT"] == "30" and env["EGPU_MEMORY_MIB"] == "8192"
    assert env["EGPU_ISOLATION"] == "accounting-only"
    # containerd applied the CDI device: the container runs with exactly that environment
    printed = k8s_cluster.kubectl("logs", "user", "-n", k8s_namespace).stdout.splitlines()
    for name, value in env.items():
        assert f"{name}={value}" in printed, (name, value, printed)

    # kubelet follows the plugin's health stream into the pod's status; the card fails (the
    # fake inventory's health list, re-read by the running agent): the pod's status says so
    def device_health() -> list[tuple[str, str]]:
        pod = kube.get(PODS.path(namespace=k8s_namespace, name="user"))
        (main,) = pod["status"]["containerStatuses"]
        return [(r["resourceID"], r["health"]) for s in main.get("allocatedResourcesStatus")
                or [] for r in s["resources"]]
    cdi_id = f"{DRIVER}/gpu={uid}-{result['device']}"
    wait_for(lambda: device_health() == [(cdi_id, "Healthy")], "Healthy in pod status", agent)
    inventory = tmp_agent_dir(agent) / "inventory.yaml"
    inventory.write_text(dump_yaml({**INVENTORY, "health": [
        {"index": index, "reason": "XID 79"}]}))
    wait_for(lambda: device_health() == [(cdi_id, "Unhealthy")], "Unhealthy in pod status",
             agent)

    # kubelet restarts: it deletes its node's DRA slices as it starts and registers the plugin
    # again (the socket is still there); the agent publishes them again. Should kubelet repeat
    # the running pod's prepare, the checkpoint answers it: "prepared" is logged once.
    log = agent.log_path
    registrations = log.read_text().count(REGISTERED)
    real_node.restart_kubelet()
    wait_for(lambda: log.read_text().count(REGISTERED) > registrations, "re-registration",
             agent)
    wait_for(lambda: bool(existing_slices(kube, real_node.name)), "slices again", agent)
    time.sleep(3)  # a wipe still under way would show here
    assert existing_slices(kube, real_node.name)
    assert log.read_text().count(f"prepared ResourceClaim {k8s_namespace}/share") == 1
    assert phase() == "Running"

    # the pod goes: kubelet calls NodeUnprepareResources, the spec goes with it. The call
    # removes the spec, then forgets the claim in the checkpoint (a file written), then logs:
    # wait for its end, the log line, not for its first step (the spec file gone), or a slow
    # checkpoint write leaves the line unwritten when the log is read
    kube.delete(PODS.path(namespace=k8s_namespace, name="user"))
    wait_for(lambda: f"unprepared claim {uid}" in log.read_text(), "unprepare", agent)
    assert not spec_file(cdi, uid).exists()


def test_kubelet_prepares_a_mig_claim_by_profile(
        dra_agent: tuple[ProcessHandle, Path], real_node: RealNode, k8s_cluster: ControlPlane,
        k8s_namespace: str) -> None:
    """kube-scheduler picks a MIG instance by the class and the profile attribute, consuming
    its card's counters; kubelet prepares it: the container is given that instance."""
    agent, cdi = dra_agent
    kube = k8s_cluster.kube()
    claims = []
    for name in ("mig-a", "mig-b"):
        manifest = claim_manifest(name, k8s_namespace)
        manifest["spec"]["devices"]["requests"][0]["exactly"] = {
            "deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression":
                f'device.attributes["{DRIVER}"].profile == "3g.40gb"'}}]}
        claims.append(kube.create(RESOURCE_CLAIMS.path(namespace=k8s_namespace), manifest))
        kube.create(PODS.path(namespace=k8s_namespace),
                    claim_user_pod(f"{name}-user", name, real_node, "exec sleep 3600"))

    def running(name: str) -> bool:
        return pod_phase(kube, k8s_namespace, name) == "Running"
    wait_for(lambda: running("mig-a-user") and running("mig-b-user"), "MIG pods Running", agent)

    given = set()
    for claim in claims:
        uid = claim["metadata"]["uid"]
        allocated = kube.get(RESOURCE_CLAIMS.path(namespace=k8s_namespace,
                                                  name=claim["metadata"]["name"]))
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        assert result["device"] in ("gpu-2-mig-0-3g-40gb", "gpu-2-mig-4-3g-40gb")
        env = env_of(json.loads(spec_file(cdi, uid).read_text()), f"{uid}-{result['device']}")
        assert env["EGPU_ISOLATION"] == "mig"
        given.add(env["NVIDIA_VISIBLE_DEVICES"])
    # two claims, the card's two instances: one each
    assert given == {"MIG-dra-2a", "MIG-dra-2b"}


@contextlib.contextmanager
def placing_for_dra(k8s_cluster: ControlPlane, tmp_path: Path, name: str, namespace: str,
                    start_kube_scheduler: Callable[..., Any]) -> Iterator[Any]:
    """The webhook in force in `namespace` (it gates pods of our classes' claims), the
    extender (its DRA allocator places them) and a stock kube-scheduler of its name: the
    `dra-packed` path; yields the extender."""
    with running_webhook(k8s_cluster, tmp_path, name, WEBHOOK_LABEL) as hook, \
            running_extender(k8s_cluster, tmp_path, config={"nodePolicy": "binpack"},
                             start_timeout_s=120) as extender:
        k8s_cluster.kubectl("label", "namespace", namespace, f"{WEBHOOK_LABEL}={hook.name}")
        wait_in_force(k8s_cluster, namespace)
        start_kube_scheduler(plain_kube_scheduler_config(extender.scheduler_name))
        yield extender


def _allocation_managers(claim: dict[str, Any]) -> set[str]:
    """Who wrote the claim's `status.allocation`, by the API server's own record (the
    managedFields entries of the status subresource owning `f:allocation`)."""
    return {str(entry.get("manager")) for entry in claim["metadata"].get("managedFields") or []
            if entry.get("subresource") == "status"
            and "f:allocation" in ((entry.get("fieldsV1") or {}).get("f:status") or {})}


def test_a_dra_packed_claim_gated_by_the_webhook_placed_by_our_allocator_and_prepared(
        dra_agent: tuple[ProcessHandle, Path], real_node: RealNode, k8s_cluster: ControlPlane,
        k8s_namespace: str, tmp_path: Path,
        start_kube_scheduler: Callable[..., Any]) -> None:
    """Issue 41 on the real kubelet node, the whole `dra-packed` path: the webhook gates the
    pod of a claim of our card class, the extender's DRA allocator (not kube-scheduler)
    writes the claim's allocation and lifts the gate, a stock kube-scheduler binds the pod,
    kubelet calls our plugin's NodePrepareResources and the container's environment is the
    share's grant (card and limits)."""
    agent, cdi = dra_agent
    kube = k8s_cluster.kube()
    with placing_for_dra(k8s_cluster, tmp_path, "dra-real", k8s_namespace,
                         start_kube_scheduler) as extender:
        claim = kube.create(RESOURCE_CLAIMS.path(namespace=k8s_namespace), claim_manifest(
            "packed", k8s_namespace, capacity={"compute": "40", "memory": "4Gi"}))
        uid = claim["metadata"]["uid"]
        created = kube.create(PODS.path(namespace=k8s_namespace), claim_user_pod(
            "packed-user", "packed", real_node, scheduler_name=extender.scheduler_name))
        # the webhook read the claim's class and gated the pod for our allocator
        assert created["spec"]["schedulingGates"] == [{"name": DRA_PLACEMENT_GATE}]

        wait_for(lambda: pod_phase(kube, k8s_namespace, "packed-user") == "Running",
                 "Running pod", agent, timeout_s=120)

        allocated = kube.get(RESOURCE_CLAIMS.path(namespace=k8s_namespace, name="packed"))
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (DRIVER, real_node.name)
        assert result["consumedCapacity"] == {"compute": "40", "memory": "4Gi"}
        # our allocator wrote the allocation (and its finalizer), kube-scheduler did not: the
        # API server names the writer; kube-scheduler only reserved the claim for the pod
        assert ALLOCATION_FINALIZER in allocated["metadata"]["finalizers"]
        writers = _allocation_managers(allocated)
        assert writers and "kube-scheduler" not in writers, allocated["metadata"]
        assert [r["name"] for r in allocated["status"]["reservedFor"]] == ["packed-user"]
        assert "DRA allocator: 1 pods placed" in extender.log_path.read_text()
        assert not kube.get(PODS.path(namespace=k8s_namespace, name="packed-user"))[
            "spec"].get("schedulingGates")

        # kubelet called our NodePrepareResources; the container runs with the grant
        assert f"prepared ResourceClaim {k8s_namespace}/packed" in agent.log_path.read_text()
        env = env_of(json.loads(spec_file(cdi, uid).read_text()), f"{uid}-{result['device']}")
        index = int(result["device"].removeprefix("gpu-"))
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-dra-{index}"
        assert env["EGPU_CORE_PERCENT"] == "40" and env["EGPU_MEMORY_MIB"] == "4096"
        printed = k8s_cluster.kubectl("logs", "packed-user", "-n",
                                      k8s_namespace).stdout.splitlines()
        for name, value in env.items():
            assert f"{name}={value}" in printed, (name, value, printed)
        kube.delete(PODS.path(namespace=k8s_namespace, name="packed-user"))
        wait_for(lambda: f"unprepared claim {uid}" in agent.log_path.read_text(), "unprepare",
                 agent)


def test_a_gated_mig_claim_placed_by_our_allocator_and_prepared(
        dra_agent: tuple[ProcessHandle, Path], real_node: RealNode, k8s_cluster: ControlPlane,
        k8s_namespace: str, tmp_path: Path,
        start_kube_scheduler: Callable[..., Any]) -> None:
    """Issue 42 on the real kubelet node: the pod of a claim of the MIG class, by profile, is
    gated by the webhook; our allocator takes the instance (`core.mig.pick`, on the fake
    carved card) and lifts the gate; kubelet prepares the claim and the container prints the
    instance it is given."""
    agent, cdi = dra_agent
    kube = k8s_cluster.kube()
    with placing_for_dra(k8s_cluster, tmp_path, "dra-mig", k8s_namespace,
                         start_kube_scheduler) as extender:
        manifest = claim_manifest("mig", k8s_namespace)
        manifest["spec"]["devices"]["requests"][0]["exactly"] = {
            "deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression":
                f'device.attributes["{DRIVER}"].profile == "3g.40gb"'}}]}
        uid = kube.create(RESOURCE_CLAIMS.path(namespace=k8s_namespace),
                          manifest)["metadata"]["uid"]
        created = kube.create(PODS.path(namespace=k8s_namespace), claim_user_pod(
            "mig-user", "mig", real_node, scheduler_name=extender.scheduler_name))
        assert created["spec"]["schedulingGates"] == [{"name": DRA_PLACEMENT_GATE}]

        wait_for(lambda: pod_phase(kube, k8s_namespace, "mig-user") == "Running",
                 "Running pod", agent, timeout_s=120)

        allocated = kube.get(RESOURCE_CLAIMS.path(namespace=k8s_namespace, name="mig"))
        (result,) = allocated["status"]["allocation"]["devices"]["results"]
        # the card's two 3g instances are equal to the rule (one card, nothing held): the
        # lower start
        assert (result["pool"], result["device"]) == (real_node.name, "gpu-2-mig-0-3g-40gb")
        writers = _allocation_managers(allocated)
        assert writers and "kube-scheduler" not in writers, allocated["metadata"]
        assert ALLOCATION_FINALIZER in allocated["metadata"]["finalizers"]

        env = env_of(json.loads(spec_file(cdi, uid).read_text()), f"{uid}-{result['device']}")
        assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-dra-2a"
        assert env["EGPU_ISOLATION"] == "mig"
        printed = k8s_cluster.kubectl("logs", "mig-user", "-n",
                                      k8s_namespace).stdout.splitlines()
        assert "NVIDIA_VISIBLE_DEVICES=MIG-dra-2a" in printed, printed
        kube.delete(PODS.path(namespace=k8s_namespace, name="mig-user"))
        wait_for(lambda: f"unprepared claim {uid}" in agent.log_path.read_text(), "unprepare",
                 agent)
