"""The Node's GPU capacity in its status: the one merge patch both node modes write
(`agent.nodemode`), and the capacity the sandbox's kwok nodes are created with agrees with it
(`devcluster.nodes`). On a real node kubelet computes the same numbers for device-plugin
resources; resources without a plugin (MiB of gpu-memory, a DRA node's node-level count) exist
only through this patch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.quota import with_accounting
from elastic_gpu.core.resources import is_gpu_resource
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient


def _ours(name: str, config: AgentConfig) -> bool:
    return is_gpu_resource(name) or name in (config.time_sliced_resource, NODE_CORE)


def status_patch(status: Mapping[str, Any], capacity: Mapping[str, str],
                 allocatable: Mapping[str, str], config: AgentConfig) -> dict[str, Any] | None:
    """The merge patch of a Node's `status` that makes it carry the node's GPU names as
    `core.quota.with_accounting` says (these GPU names, the quota's accounting names beside
    them), with GPU names no longer offered removed (null) and everything else (CPU, memory,
    pods) left alone; None when it carries them already. Every GPU node advertises the
    accounting names, in either mode: the webhook puts them on every GPU container, and once a
    DeviceClass maps `nvidia.com/gpu` (docs/dra.md), kube-scheduler's DynamicResources filter
    checks every extended resource of such a pod against every node, device-plugin nodes
    included. Counts compare as quantities (the API server writes 1000000000 back as `1G`);
    a restarting kubelet's zero is a count to write again."""
    patch: dict[str, dict[str, str | None]] = {}
    for field, gpu in (("capacity", capacity), ("allocatable", allocatable)):
        want = with_accounting(gpu)
        have = status.get(field) or {}
        changes: dict[str, str | None] = {k: None for k in have
                                          if _ours(k, config) and k not in want}
        changes.update({k: v for k, v in want.items() if not _same(have.get(k), v)})
        if changes:
            patch[field] = changes
    return {"status": patch} if patch else None


def _same(found: Any, want: str) -> bool:
    """Equal quantities (the API server writes 1000000000 back as `1G`)."""
    try:
        return found is not None and parse_quantity(str(found)) == parse_quantity(want)
    except QuantityError:
        return False


def patch_node_capacity(client: SyncKubeClient, node_name: str, capacity: Mapping[str, str],
                        allocatable: Mapping[str, str], config: AgentConfig) -> str:
    """Make the Node's status carry the node's GPU names (`status_patch`); no write when it
    does already (the sync loop calls this periodically because a restarting kubelet zeroes
    every extended resource, including the status-only ones). Returns the Node's uid."""
    current = client.get(NODES.path(name=node_name))
    patch = status_patch(current.get("status") or {}, capacity, allocatable, config)
    if patch is not None:
        client.patch(NODES.path(name=node_name, subresource="status"), patch)
    return str((current.get("metadata") or {}).get("uid"))
