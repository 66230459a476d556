"""The pods of this node, as Allocate and the allocation columns need them (lightkube, sync).

Allocate lists pods live instead of from a watch cache: kubelet admits a pod only after it saw
the pod bound, and the scheduler wrote the assignment before binding, so a live list always
contains it, where a cache might lag behind and make the match miss or look ambiguous.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

from elastic_gpu.core import annotations as ann


class PodSource(Protocol):
    def list_on_node(self, node: str) -> list[dict[str, Any]]: ...

    def mark_allocated(self, namespace: str, name: str, value: str) -> None: ...


@functools.cache
def raw_pods() -> Any:
    """Pods as plain dicts: lightkube's typed Pod model costs about 1 ms per pod to build
    and convert back, which made Allocate on a busy node ten times slower; a generic resource
    on the same path is just the JSON."""
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource("", "v1", "EgpuRawPod", "pods")


class ApiPods:
    """`PodSource` over a lightkube `Client`."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._raw = raw_pods()

    def list_on_node(self, node: str) -> list[dict[str, Any]]:
        pods = self.client.list(self._raw, namespace="*", fields={"spec.nodeName": node})
        return [dict(pod) for pod in pods]

    def mark_allocated(self, namespace: str, name: str, value: str) -> None:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        self.client.patch(Pod, name, {"metadata": {"annotations": {ann.ALLOCATED: value}}},
                          namespace=namespace, patch_type=PatchType.MERGE)
