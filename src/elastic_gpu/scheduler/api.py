"""The API calls of a bind, with lightkube: read the pod, create its Binding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        import msgspec
        from lightkube.models.core_v1 import ObjectReference
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Pod

        # pods/<name>/binding honours metadata.uid and metadata.resourceVersion as
        # preconditions and copies metadata.annotations onto the pod in the same write.
        binding = Pod.Binding(
            metadata=ObjectMeta(name=name, namespace=namespace, uid=uid,
                                resourceVersion=(str(resource_version)
                                                 if resource_version is not None else None),
                                annotations=dict(annotations) or None),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node))
        try:
            await self.client.create(binding, name=name, namespace=namespace)
        except msgspec.ValidationError:
            # The apiserver answers 201 with a Status, which lightkube then fails to decode
            # as a Binding; errors (4xx/5xx) are raised before decoding, as ApiError.
            return
        except Exception as err:
            raise _bind_error(err) from None
