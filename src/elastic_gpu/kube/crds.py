"""Install CustomResourceDefinitions as an installer would (`kubectl apply -f deploy/crds/`).

For the sandbox and the tests, with an installer's (admin) credentials; no component of the
product installs CRDs at run time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_gpu.kube.client import CRDS, MERGE_PATCH, PRIORITY_CLASSES
from elastic_gpu.kube.errors import Conflict, NotFound, TooManyRequests
from elastic_gpu.kube.paths import Resource, group_prefix
from elastic_gpu.kube.sync import SyncKubeClient


class CrdInstallError(RuntimeError):
    """A CRD could not be applied, or did not become Established in time."""


def install_crds(client: SyncKubeClient, manifests: Iterable[Mapping[str, Any]],
                 timeout_s: float = 30.0) -> None:
    """Create (or update) each CRD, then wait until every one is Established and its resource
    can be listed (Established is not yet servable: the apiserver answers 404 or 429 for a
    moment)."""
    manifests = list(manifests)
    for manifest in manifests:
        try:
            client.create(CRDS.path(), manifest)
        except Conflict:  # any 409: it exists (a re-run, or another installer's)
            client.patch(CRDS.path(name=manifest["metadata"]["name"]),
                         {"spec": manifest["spec"]}, MERGE_PATCH)
    deadline = time.monotonic() + timeout_s
    for manifest in manifests:
        name = manifest["metadata"]["name"]
        while not established(client.get(CRDS.path(name=name))):
            if time.monotonic() > deadline:
                raise CrdInstallError(f"CRD {name} not established after {timeout_s}s")
            time.sleep(0.1)
        collection = served_resource(manifest).path()  # across namespaces when namespaced
        while True:
            try:
                client.get(collection, {"limit": "1"})  # one page is enough to be served
                break
            except (NotFound, TooManyRequests):
                pass
            if time.monotonic() > deadline:
                raise CrdInstallError(f"CRD {name} established but not served after {timeout_s}s")
            time.sleep(0.1)


def established(crd: Mapping[str, Any]) -> bool:
    """Whether a CRD object's status says Established=True."""
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def served_resource(manifest: Mapping[str, Any]) -> Resource:
    """The collection a CRD manifest defines, at its storage version."""
    spec = manifest["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("storage"))
    return Resource(group_prefix(spec["group"], version), spec["names"]["plural"],
                    spec["scope"] == "Namespaced")


def install_elasticgpu_crds(client: SyncKubeClient, timeout_s: float = 30.0) -> None:
    """The CRDs an installer applies (`api.registry`, everything but the agent's GPUDevice):
    the Elastic GPU API, the MIG adapter's MIGSubstitution and the budgets' GPUBudget."""
    from elastic_gpu.api import registry

    install_crds(client, registry.manifests("installer"), timeout_s)


def install_priority_classes(client: SyncKubeClient) -> None:
    """The budgets' PriorityClass (`api.budget.priority_class_manifest`), created or left as
    it is (its value cannot change once created)."""
    from elastic_gpu.api.budget import priority_class_manifest

    with contextlib.suppress(Conflict):
        client.create(PRIORITY_CLASSES.path(), priority_class_manifest())
