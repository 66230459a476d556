"""Install CustomResourceDefinitions as an installer would (`kubectl apply -f deploy/crds/`).

For the sandbox and the tests, with an installer's (admin) credentials; no component of the
product installs CRDs at run time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any


class CrdInstallError(RuntimeError):
    """A CRD could not be applied, or did not become Established in time."""


def install_crds(client: Any, manifests: Iterable[Mapping[str, Any]], timeout_s: float = 30.0) -> None:
    """Create (or update) each CRD, then wait until every one is Established and its resource
    can be listed (Established is not yet servable: the apiserver answers 404 or 429 for a
    moment)."""
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
    from lightkube.types import PatchType

    manifests = list(manifests)
    for manifest in manifests:
        try:
            client.create(codecs.from_dict(dict(manifest)))
        except ApiError as err:
            if err.status.code != 409:
                raise
            client.patch(CustomResourceDefinition, manifest["metadata"]["name"],
                         {"spec": manifest["spec"]}, patch_type=PatchType.MERGE)
    deadline = time.monotonic() + timeout_s
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        while True:
            crd = client.get(CustomResourceDefinition, name)
            conditions = (crd.status.conditions if crd.status else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise CrdInstallError(f"CRD {name} not established after {timeout_s}s")
            time.sleep(0.1)
        spec = manifest["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("storage"))
        names = spec["names"]
        make = create_namespaced_resource if spec["scope"] == "Namespaced" else create_global_resource
        resource = make(spec["group"], version, names["kind"], names["plural"])
        while True:
            try:
                listing = client.list(resource, namespace="*", chunk_size=1) \
                    if spec["scope"] == "Namespaced" else client.list(resource, chunk_size=1)
                for _ in listing:
                    break
                break
            except ApiError as err:
                if err.status.code not in (404, 429):
                    raise
            if time.monotonic() > deadline:
                raise CrdInstallError(f"CRD {name} established but not served after {timeout_s}s")
            time.sleep(0.1)


def install_elasticgpu_crds(client: Any, timeout_s: float = 30.0) -> None:
    """The CRDs an installer applies (`api.registry`, everything but the agent's GPUDevice):
    the Elastic GPU API, the MIG adapter's MIGSubstitution and the budgets' GPUBudget."""
    from elastic_gpu.api import registry

    install_crds(client, registry.manifests("installer"), timeout_s)


def install_priority_classes(client: Any) -> None:
    """The budgets' PriorityClass (`api.budget.priority_class_manifest`), created or left as
    it is (its value cannot change once created)."""
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError

    from elastic_gpu.api.budget import priority_class_manifest

    try:
        client.create(codecs.from_dict(priority_class_manifest()))
    except ApiError as err:
        if err.status.code != 409:
            raise
