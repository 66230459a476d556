"""Create-or-update of the cluster-scoped objects an installer owns (the sandbox's tenant roles
and admission policies; the chart does the same through helm).

A manifest names its kind, not its resource: the resource (plural, scope) is read from the
API server's discovery document of the manifest's group version, as kubectl does, so any kind
the server serves can be applied without a table of ours to keep in step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elastic_gpu.kube.client import MERGE_PATCH
from elastic_gpu.kube.errors import Conflict
from elastic_gpu.kube.paths import Resource, group_prefix
from elastic_gpu.kube.sync import SyncKubeClient


class UnknownKind(LookupError):
    """The API server does not serve the manifest's kind at its apiVersion."""


def create_or_update(client: SyncKubeClient, manifests: Iterable[Mapping[str, Any]]) -> None:
    """Create each object with `client`, or, if it exists, bring it to `manifest` with a merge
    patch of everything but apiVersion and kind (lists such as RBAC rules are replaced whole,
    as a merge patch does)."""
    discovered: dict[str, list[dict[str, Any]]] = {}
    for manifest in manifests:
        resource = resource_of(client, manifest, discovered)
        metadata = manifest["metadata"]
        namespace = metadata.get("namespace") if resource.namespaced else None
        try:
            client.create(resource.path(namespace), manifest)
        except Conflict:  # any 409: it exists
            body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
            client.patch(resource.path(namespace, metadata["name"]), body, MERGE_PATCH)


def resource_of(client: SyncKubeClient, manifest: Mapping[str, Any],
                discovered: dict[str, list[dict[str, Any]]] | None = None) -> Resource:
    """The resource of `manifest`'s apiVersion and kind, from the server's discovery document
    (`/api/v1` or `/apis/<group>/<version>`), read once per group version into `discovered`."""
    api_version, kind = str(manifest["apiVersion"]), str(manifest["kind"])
    group, _, version = api_version.rpartition("/")
    prefix = group_prefix(group, version)
    cache = discovered if discovered is not None else {}
    if prefix not in cache:
        cache[prefix] = list(client.get(prefix).get("resources") or [])
    for entry in cache[prefix]:
        if entry.get("kind") == kind and "/" not in str(entry.get("name", "")):
            return Resource(prefix, str(entry["name"]), bool(entry.get("namespaced")))
    raise UnknownKind(f"the API server serves no kind {kind} in {api_version}")
