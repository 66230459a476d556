"""The tests' control plane: the package's `ControlPlane` plus `client()`, a lightkube Client.

The package talks to the API server only through `elastic_gpu.kube` (`ControlPlane.kube()`);
tests may still use lightkube's typed objects as a tool, so the fixture's control plane (and a
benchmark's) is this subclass, which builds one from the cluster's admin kubeconfig.
"""

from __future__ import annotations

from typing import Any

from elastic_gpu.devcluster.controlplane import ControlPlane


def lightkube_client(plane: ControlPlane, field_manager: str = "egpu-dev") -> Any:
    """A lightkube Client for `plane`'s admin identity (typed as Any: lightkube is untyped)."""
    from lightkube import Client, KubeConfig

    return Client(config=KubeConfig.from_file(plane.kubeconfig), field_manager=field_manager)


class TestCluster(ControlPlane):
    """A `ControlPlane` whose `client()` is a new lightkube Client for the admin identity."""

    __test__ = False  # not a test class, whatever pytest's name pattern says

    def client(self) -> Any:
        return lightkube_client(self)
