"""Create-or-update of the cluster-scoped objects an installer owns (the sandbox's tenant roles
and admission policies; the chart does the same through helm)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def create_or_update(client: Any, manifests: Iterable[Mapping[str, Any]]) -> None:
    """Create each cluster-scoped object with `client` (a lightkube Client), or, if it exists,
    bring it to `manifest` with a merge patch of everything but apiVersion and kind (lists such
    as RBAC rules are replaced whole, as a merge patch does)."""
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.types import PatchType

    for manifest in manifests:
        obj = codecs.from_dict(dict(manifest))
        try:
            client.create(obj)
        except ApiError as err:
            if err.status.code != 409:
                raise
            body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
            client.patch(type(obj), manifest["metadata"]["name"], body,
                         patch_type=PatchType.MERGE)
