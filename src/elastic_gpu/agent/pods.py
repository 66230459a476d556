"""The pods of this node, as Allocate and the allocation columns need them (lightkube, sync).

Allocate lists pods live instead of from a watch cache: kubelet admits a pod only after it saw
the pod bound, and the scheduler wrote the assignment before binding, so a live list always
contains it, where a cache might lag behind and make the match miss or look ambiguous.
"""

from __future__ import annotations

from typing import Any, Protocol

from elastic_gpu.core import annotations as ann


class PodSource(Protocol):
    def list_on_node(self, node: str) -> list[dict[str, Any]]: ...

    def mark_allocated(self, namespace: str, name: str, value: str) -> None: ...


class ApiPods:
    """`PodSource` over a lightkube `Client`."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def list_on_node(self, node: str) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        pods = self.client.list(Pod, namespace="*", fields={"spec.nodeName": node})
        return [pod.to_dict() for pod in pods]

    def mark_allocated(self, namespace: str, name: str, value: str) -> None:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        self.client.patch(Pod, name, {"metadata": {"annotations": {ann.ALLOCATED: value}}},
                          namespace=namespace, patch_type=PatchType.MERGE)
