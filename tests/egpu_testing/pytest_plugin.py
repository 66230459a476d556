"""pytest fixtures: one real control plane shared by the whole test run (by each pytest-xdist
worker of it: session scope is per worker process; tests/conftest.py says how tests are split).

- `k8s_cluster` (session): etcd + kube-apiserver + kube-controller-manager + kube-scheduler +
  kwok; a `ControlPlane`
  with `.kubeconfig`, `.bin_dir`, `.server`, `.kubectl(*args)`, `.kube()` (the package's
  client) and `.client()` (a lightkube Client, `egpu_testing.cluster.TestCluster`).
- `start_kube_scheduler` (test): `start_kube_scheduler(config_dict) -> SchedulerHandle` runs
  another kube-scheduler with a KubeSchedulerConfiguration against the shared apiserver;
  stopped after the test.
- `k8s_namespace` (test): a fresh namespace with its `default` ServiceAccount; deleted after
  the test (the namespace controller removes what is in it).
- `real_node` (module, `realnode_pytest.py`): a real kubelet node (containerd, runc) joined
  to `k8s_cluster`; skipped with the exact reason where the machine cannot run one.
- `dra_device_classes`, `dra_gate_policy` (test): our DeviceClasses, the policy
  `elastic-gpu-dra-gate` (enforced), on the shared control plane for one test.
- `fake_gpu_nodes` (test): `fake_gpu_nodes(count, gpus=8, ..., agent_config=None) -> [names]`
  registers Ready fake GPU nodes, published as an agent with `agent_config` (an AgentConfig or
  its dict form) would publish them; removed after the test with their pods and GPUDevices.

Nothing is skipped: without binaries the fixture errors with how to build them. Processes
die with the test run even when it is killed (SIGKILL to the group, parent-death signal).
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import pytest

from egpu_testing.cluster import TestCluster
from egpu_testing.realnode_pytest import real_node
from elastic_gpu.devcluster.controlplane import ControlPlane, SchedulerHandle
from elastic_gpu.devcluster.nodes import (
    fake_inventory,
    register_fake_nodes,
    unregister_fake_node,
)
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    plane = TestCluster(work_dir=tmp_path_factory.mktemp("k8s"), die_with_parent=True)
    # SIGTERM (CI cancelling a job) becomes an interrupt, so fixture teardown still runs.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        plane.start(scheduler=True, kwok_enabled=True)
        yield plane
    finally:
        plane.stop()
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def start_kube_scheduler(
    k8s_cluster: ControlPlane,
) -> Iterator[Callable[..., SchedulerHandle]]:
    started: list[SchedulerHandle] = []

    def start(config: Mapping[str, Any], name: str | None = None) -> SchedulerHandle:
        handle = k8s_cluster.start_scheduler(config, name=name)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.stop()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def k8s_namespace(k8s_cluster: ControlPlane) -> Iterator[str]:
    name = unique_name("t")
    k8s_cluster.kubectl("create", "namespace", name)
    # The ServiceAccount admission plugin refuses pods until the serviceaccount controller
    # has made the namespace's `default` account (it retries ~1 s itself; a loaded machine
    # can take longer).
    wait_default_service_account(k8s_cluster, name)
    yield name
    delete_namespace(k8s_cluster, name)


def delete_namespace(plane: ControlPlane, name: str) -> None:
    """Delete a test namespace without waiting: its pods first, at once (kwok finishes their
    deletion), then the namespace, whose controller deletes the rest and then the namespace.
    Without kube-controller-manager the namespace would stay Terminating: only pods go."""
    plane.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force",
                  "--wait=false", check=False)
    if plane.controller_manager:
        plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def wait_default_service_account(plane: ControlPlane, namespace: str,
                                 timeout_s: float = 30.0) -> None:
    """Wait until `namespace` has its `default` ServiceAccount (no-op without a
    kube-controller-manager, whose absence also turns the admission plugin off)."""
    if not plane.controller_manager:
        return
    deadline = time.monotonic() + timeout_s
    while plane.kubectl("get", "serviceaccount", "default", "-n", namespace,
                        check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {namespace} has no default ServiceAccount after "
                               f"{timeout_s:.0f} s; see the kube-controller-manager log")
        time.sleep(0.1)


@pytest.fixture
def fake_gpu_nodes(k8s_cluster: ControlPlane) -> Iterator[Callable[..., list[str]]]:
    created: list[str] = []
    client = k8s_cluster.kube()

    def add(count: int = 1, *, gpus: int = 8, labels: Mapping[str, str] | None = None,
            agent_config: Any = None, prefix: str = "gpu", **kwargs: Any) -> list[str]:
        prefix = unique_name(prefix)
        inventories = [fake_inventory(f"{prefix}-{i}", gpus=gpus, **kwargs)
                       for i in range(count)]
        if labels:
            inventories = [_with_labels(inv, labels) for inv in inventories]
        created.extend(inv.name for inv in inventories)
        register_fake_nodes(client, inventories, agent_config=agent_config)
        _wait_ready(client, [inv.name for inv in inventories])
        return [inv.name for inv in inventories]

    yield add
    for name in created:
        unregister_fake_node(client, name)


@pytest.fixture
def dra_device_classes(k8s_cluster: ControlPlane) -> Iterator[None]:
    """Our DeviceClasses on the worker's control plane for one test, deleted after it. They are
    cluster-scoped and `gpu.elasticgpu.io` maps `nvidia.com/gpu` (DRAExtendedResource): left
    behind, they turn a later test's `nvidia.com/gpu` pod into a claim kube-scheduler tries to
    allocate on every node without that resource ("cannot allocate all claims")."""
    from elastic_gpu.core.dra.classes import device_classes
    from elastic_gpu.kube.apply import create_or_update
    from elastic_gpu.kube.errors import NotFound
    from elastic_gpu.kube.resources import DEVICE_CLASSES

    client = k8s_cluster.kube()
    create_or_update(client, device_classes())
    yield
    for cls in device_classes():
        with contextlib.suppress(NotFound):
            client.delete(DEVICE_CLASSES.path(name=cls["metadata"]["name"]))


@pytest.fixture
def dra_gate_policy(k8s_cluster: ControlPlane) -> Iterator[None]:
    """The ValidatingAdmissionPolicy `elastic-gpu-dra-gate` and its binding for one test,
    enforced when the test starts (kube-apiserver loads a policy a moment after its creation:
    a tenant's dry-run removal of a probe pod's gate is tried until refused), deleted after."""
    from pathlib import Path

    from egpu_testing.dra import gated_claim_pod
    from egpu_testing.sandbox import kubectl_run
    from egpu_testing.tenant import make_tenant
    from elastic_gpu.api.admission_policies import DRA_GATE, binding
    from elastic_gpu.api.admission_policies import dra_gate_policy as policy
    from elastic_gpu.kube.apply import create_or_update
    from elastic_gpu.kube.resources import PODS

    kubeconfig = Path(k8s_cluster.kubeconfig)
    client = k8s_cluster.kube()
    create_or_update(client, [policy(), binding(policy())])
    tenant = make_tenant(kubeconfig, f"gate-probe-{uuid.uuid4().hex[:6]}")
    client.create(PODS.path(tenant.namespace), gated_claim_pod("probe", tenant.namespace,
                                                               "probe", {}))
    deadline = time.monotonic() + 30
    while tenant.run("patch", "pod", "probe", "--dry-run=server", "--type=json", "-p=" + (
            '[{"op": "remove", "path": "/spec/schedulingGates"}]')).returncode == 0:
        assert time.monotonic() < deadline, f"{DRA_GATE} not enforced after 30 s"
        time.sleep(0.2)
    kubectl_run(kubeconfig, "delete", "namespace", tenant.namespace, "--wait=false")
    yield
    for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        kubectl_run(kubeconfig, "delete", f"{kind}.admissionregistration.k8s.io", DRA_GATE,
                    "--ignore-not-found")


def _with_labels(inventory: Any, labels: Mapping[str, str]) -> Any:
    from dataclasses import replace

    return replace(inventory, labels={**inventory.labels, **labels})


def _wait_ready(client: SyncKubeClient, names: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for name in list(pending):
            node = client.get(NODES.path(name=name))
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                pending.discard(name)
        if pending:
            time.sleep(0.1)
    if pending:
        raise TimeoutError(f"fake nodes not Ready after {timeout_s:.0f} s: {sorted(pending)}")


__all__ = [
    "delete_namespace",
    "fake_gpu_nodes",
    "k8s_cluster",
    "k8s_namespace",
    "real_node",
    "start_kube_scheduler",
    "unique_name",
    "wait_default_service_account",
]
