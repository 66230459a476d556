"""The node agent (fake backend) of a real node: its config and command line.

The agent runs on the host, outside the node's mount namespace: kubelet's hard-coded
/var/lib/kubelet/device-plugins/ is, seen from the host, `RealNode.device_plugin_dir`, so the
agent serves its sockets there and registers with the real kubelet through its kubelet.sock.

The fake backend hands out no device files unless its inventory lists them (`devices:`,
`controlDevices:`); on a real node runc must then create each one in the container, so a path
that does not exist on the host is refused here, before any pod fails on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from elastic_gpu.api.config.strict_yaml import dump_yaml
from elastic_gpu.devcluster.errors import DevClusterError


def default_inventory(gpus: int = 2, model: str = "A100-SXM4-80GB",
                      memory_mib: int = 81920) -> dict[str, Any]:
    """A fake inventory of `gpus` plain cards (no device files)."""
    return {"cards": [{"model": model, "memoryMiB": memory_mib} for _ in range(gpus)]}


def missing_device_files(inventory: Mapping[str, Any]) -> list[str]:
    """Device files the inventory names that this host does not have."""
    paths: list[str] = [str(p) for p in inventory.get("controlDevices") or []]
    for card in inventory.get("cards") or []:
        paths.extend(str(p) for p in card.get("devices") or [])
    return [p for p in paths if not os.path.exists(p)]


def write_agent_files(directory: Path, device_plugin_dir: Path,
                      inventory: Mapping[str, Any],
                      config: Mapping[str, Any] | None = None) -> Path:
    """Write the fake inventory and the agent config into `directory`; the config's path.

    `config`: the agent config in the agent's own form (docs/agent.md); `backend`,
    `fake.inventory` and `devicePluginDirectory` are set here (they are what makes it this node's).
    """
    missing = missing_device_files(inventory)
    if missing:
        raise DevClusterError(
            f"the real node's fake inventory names device files this host lacks: {missing}; "
            "runc would fail to create them in the container. Leave `devices:` and "
            "`controlDevices:` out of the inventory (the fake backend then hands out none)")
    directory.mkdir(parents=True, exist_ok=True)
    inventory_path = directory / "inventory.yaml"
    inventory_path.write_text(dump_yaml(dict(inventory)))
    merged: dict[str, Any] = dict(config or {})
    if merged.get("backend", "fake") != "fake":
        raise DevClusterError(f"a real node's agent runs the fake backend (got backend "
                              f"{merged['backend']!r}): the machine has no GPUs")
    merged["backend"] = "fake"
    merged["fake"] = {**dict(merged.get("fake") or {}), "inventory": str(inventory_path)}
    merged.pop("devicePluginDir", None)  # its old spelling: set here, whatever it said
    merged["devicePluginDirectory"] = str(device_plugin_dir) + "/"
    config_path = directory / "agent.yaml"
    config_path.write_text(dump_yaml(merged))
    return config_path


def agent_argv(node: str, kubeconfig: Path, config_path: Path,
               extra: Sequence[str] = ()) -> list[str]:
    """`egpu agent` for `node`, with this interpreter (works from a source checkout too)."""
    return [sys.executable, "-m", "elastic_gpu.cli.main", "agent", "--node", node,
            "--kubeconfig", str(kubeconfig), "--config", str(config_path), *extra]
