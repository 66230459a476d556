"""A real Kubernetes control plane for development and tests (etcd, kube-apiserver,
kube-scheduler, kwok built by hack/ensure-k8s.sh) and fake GPU nodes for it."""

from elastic_gpu.devcluster.controlplane import ControlPlane, SchedulerHandle
from elastic_gpu.devcluster.errors import (
    ComponentStartError,
    DevClusterError,
    MissingBinariesError,
    PortInUseError,
)
from elastic_gpu.devcluster.nodes import fake_inventory, register_fake_node, register_fake_nodes

__all__ = [
    "ComponentStartError",
    "ControlPlane",
    "DevClusterError",
    "MissingBinariesError",
    "PortInUseError",
    "SchedulerHandle",
    "fake_inventory",
    "register_fake_node",
    "register_fake_nodes",
]
