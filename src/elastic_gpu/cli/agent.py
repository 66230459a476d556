"""`egpu agent`: the node agent (device plugins, inventory, health). See docs/agent.md."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.cli.check import check_config
from elastic_gpu.cli.options import LogLevel, start_logging


def agent(
    config: Annotated[Path | None, typer.Option(
        "--config", help="Agent config YAML (docs/agent.md); defaults apply without one.")] = None,
    node: Annotated[str | None, typer.Option(
        "--node", envvar="NODE_NAME", help="This node's name (DaemonSet: from spec.nodeName).")] = None,
    kubeconfig: Annotated[Path | None, typer.Option(
        "--kubeconfig", help="Kubeconfig file; in-cluster service account when omitted.")] = None,
    no_api: Annotated[bool, typer.Option(
        "--no-api", help="Serve device plugins only (no inventory; only time-sliced "
        "resources can Allocate without the API). Refused with dra.enabled.")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port",
        help="Serve Prometheus /metrics (elasticgpu_agent_*, docs/metrics.md) on this port; "
        "0 (the default): no metrics. Config metrics.port; given, it beats the file's value."
    )] = None,
    metrics_host: Annotated[str | None, typer.Option(
        "--metrics-host", help="Address the metrics port listens on (default 0.0.0.0). Config "
        "metrics.host; given, it beats the file's value.")] = None,
    log_level: LogLevel = "INFO",
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="The same as --log-level DEBUG (kept for the manifests that "
        "pass it; wins over --log-level).")] = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Only read and validate --config: print each problem (field, value, "
        "rule) and exit 2, or say it is valid and exit 0; nothing is started.")] = False,
) -> None:
    """Run the node agent: kubelet device plugins (or, with dra.enabled in --config, the DRA
    driver gpu.elasticgpu.io: ResourceSlices and kubelet's DRA plugin) over NVML or the fake
    backend."""
    from elastic_gpu.agent.config import load_config, parse_config
    from elastic_gpu.api.config.loader import ConfigError
    from elastic_gpu.api.config.merge import Override

    # a flag given beats the file's key (docs/config.md, "Precedence")
    flags = [Override("metrics.port", "--metrics-port", metrics_port),
             Override("metrics.host", "--metrics-host", metrics_host)]
    if check:
        check_config("egpu agent", config, lambda path: load_config(path, flags))
        return
    from elastic_gpu.agent.backends.base import BackendError
    from elastic_gpu.agent.backends.registry import make_backend
    from elastic_gpu.agent.devices import InventoryError
    from elastic_gpu.agent.nodemode import NodeModeError
    from elastic_gpu.agent.runtime import Agent

    start_logging("egpu agent", "DEBUG" if verbose else log_level)
    node_name = node or os.environ.get("NODE_NAME")
    if not node_name:
        typer.echo("egpu agent: --node (or NODE_NAME) is required", err=True)
        raise typer.Exit(2)
    try:
        cfg = load_config(config, flags) if config is not None else parse_config(
            {}, "flags", flags)
    except ConfigError as err:
        typer.echo(f"egpu agent: {err}", err=True)
        raise typer.Exit(2) from None
    if no_api and cfg.dra.enabled:
        typer.echo("egpu agent: --no-api cannot serve dra.enabled (ResourceSlices and "
                   "ResourceClaims are API objects)", err=True)
        raise typer.Exit(2)
    client = None
    if not no_api:
        from elastic_gpu.kube.kubeconfig import ClientConfigError
        from elastic_gpu.kube.sync import SyncKubeClient

        try:
            client = SyncKubeClient.from_config(kubeconfig, field_manager="egpu-agent")
        except (ClientConfigError, OSError) as err:
            typer.echo(f"egpu agent: no Kubernetes API configuration ({err}); pass "
                       "--kubeconfig outside a cluster", err=True)
            raise typer.Exit(2) from None
    try:
        backend = make_backend(cfg, node_name)
        running = Agent(cfg, backend, node_name, client)
    except (BackendError, InventoryError) as err:
        # Nothing has been advertised: a node that cannot serve its GPUs offers none.
        typer.echo(f"egpu agent: {err}", err=True)
        raise typer.Exit(1) from None
    # Handlers first: kubelet may see our devices before start() returns.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: running.request_stop())
    try:
        running.start()
        if cfg.metrics.port:
            running.serve_metrics(cfg.metrics.host, cfg.metrics.port)
    except NodeModeError as err:  # the Node is in the other mode's node group: nothing published
        running.stop()
        typer.echo(f"egpu agent: {err}", err=True)
        raise typer.Exit(1) from None
    except Exception as err:  # API unreachable, RBAC, socket directory not writable, port ...
        running.stop()
        typer.echo(f"egpu agent: cannot start: {type(err).__name__}: {err}", err=True)
        raise typer.Exit(1) from None
    running.wait()
    running.stop()
    if client is not None:
        client.close()
