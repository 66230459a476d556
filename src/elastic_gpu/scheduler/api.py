"""The API writes of a bind, with lightkube: annotate the pod, create its Binding."""

from __future__ import annotations

import functools
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.k8s.cache import to_manifest
from elastic_gpu.scheduler.server import BindError


def _bind_error(err: Exception) -> BindError:
    from lightkube.core.exceptions import ApiError

    if isinstance(err, ApiError):
        code = int(err.status.code or 0)
        # 5xx and 429 may or may not have been applied; 4xx were refused.
        definite = 400 <= code < 500 and code != 429
        return BindError(f"{code} {err.status.reason or ''}: {err.status.message or ''}".strip(),
                         definite=definite, code=code)
    return BindError(f"{type(err).__name__}: {err}", definite=False)


class LightkubePodApi:
    def __init__(self, client: Any) -> None:
        self.client = client

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Pod

        try:
            return to_manifest(await self.client.get(Pod, name, namespace=namespace))
        except ApiError as err:
            if err.status.code == 404:
                return None
            raise _bind_error(err) from None
        except Exception as err:
            raise _bind_error(err) from None

    async def _patch(self, namespace: str, name: str, uid: str,
                     annotations: dict[str, str | None]) -> dict[str, Any]:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        # metadata.uid in a merge patch is a precondition: a re-created pod of the same name
        # has another UID, and the apiserver refuses the patch instead of annotating it.
        body = {"metadata": {"uid": uid, "annotations": annotations}}
        try:
            return to_manifest(await self.client.patch(Pod, name, body, namespace=namespace,
                                                       patch_type=PatchType.MERGE))
        except Exception as err:
            raise _bind_error(err) from None

    async def annotate(self, namespace: str, name: str, uid: str,
                       assignment: Assignment) -> dict[str, Any]:
        return await self._patch(namespace, name, uid, {ann.ASSIGNMENT: assignment.to_json(),
                                                         ann.ASSIGNED_NODE: assignment.node})

    async def clear(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        return await self._patch(namespace, name, uid, {ann.ASSIGNMENT: None,
                                                         ann.ASSIGNED_NODE: None})

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        # POST namespaces/<ns>/bindings: the apiserver answers with a Status, which lightkube's
        # typed Binding model cannot decode; a generic resource takes any answer.
        binding = _binding_resource()
        body = binding({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        try:
            await self.client.create(body, namespace=namespace)
        except Exception as err:
            raise _bind_error(err) from None


@functools.cache
def _binding_resource() -> Any:
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource("", "v1", "Binding", "bindings", verbs=["post"])
