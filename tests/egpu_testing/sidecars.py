"""Init containers for pod manifests: sidecars (KEP-753: `restartPolicy: Always`, running
beside the containers for the pod's life) and classic ones (each runs to completion first)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def with_init_container(pod: Mapping[str, Any], name: str, resources: Mapping[str, str], *,
                        sidecar: bool = True) -> dict[str, Any]:
    """A copy of `pod` with one more init container (after those it has) asking `resources`
    as its limits and requests: a sidecar unless `sidecar` is False."""
    out = copy.deepcopy(dict(pod))
    container: dict[str, Any] = {"name": name, "image": "busybox",
                                 "resources": {"limits": dict(resources),
                                               "requests": dict(resources)}}
    if sidecar:
        container["restartPolicy"] = "Always"
    out.setdefault("spec", {}).setdefault("initContainers", []).append(container)
    return out
