"""`egpu controller`: every controller of the project in one leader-elected process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.cli.check import check_config
from elastic_gpu.cli.options import LogLevel, start_logging


def controller(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="kubeconfig file; without it, the in-cluster service account")] = None,
    extender_url: Annotated[str, typer.Option(
        help="the extender (`egpu scheduler`) whose POST /provision chooses the cards of "
             "Immediate claims")] = "http://127.0.0.1:8888",
    extender_ca: Annotated[Path | None, typer.Option(
        help="verify the extender's HTTPS certificate with this CA")] = None,
    extender_client_cert: Annotated[Path | None, typer.Option(
        help="client certificate presented to the extender (its --tls-client-ca)")] = None,
    extender_client_key: Annotated[Path | None, typer.Option(
        help="private key of --extender-client-cert")] = None,
    lease_namespace: Annotated[str, typer.Option(
        envvar="POD_NAMESPACE", help="namespace of the leader-election Lease")] = "kube-system",
    lease_name: Annotated[str, typer.Option(help="name of the Lease")] = "egpu-controller",
    identity: Annotated[str | None, typer.Option(
        help="this replica's Lease holder identity (default hostname_pid): unique among live "
             "replicas; the same across restarts of one (a pod's name) lets a restarted "
             "leader renew its Lease at once instead of waiting for it to expire")] = None,
    lease_duration: Annotated[float, typer.Option(
        min=1, help="seconds a Lease not renewed stays valid for the others")] = 15.0,
    renew_deadline: Annotated[float, typer.Option(
        min=0.1, help="seconds the leader retries renewing before it gives up (and exits)")
    ] = 10.0,
    retry_period: Annotated[float, typer.Option(
        min=0.05, help="seconds between acquire / renew attempts")] = 2.0,
    metrics_host: Annotated[str, typer.Option(
        help="address of /metrics, /healthz, /readyz")] = "127.0.0.1",
    metrics_port: Annotated[int, typer.Option(min=1, max=65535)] = 8080,
    workers: Annotated[int, typer.Option(min=1, max=256,
                                         help="concurrent reconciles per controller")] = 16,
    backoff_base: Annotated[float, typer.Option(
        min=0.001, help="first retry delay of a failed key, seconds (doubles each time)")
    ] = 0.005,
    backoff_max: Annotated[float, typer.Option(min=0.001, help="longest retry delay, seconds")
                           ] = 10.0,
    budget_default_gpu_hours: Annotated[float | None, typer.Option(
        min=0, help="the cluster default budget: GPU-hours per --budget-default-period for "
                    "every namespace that runs GPU pods and has no GPUBudget (the keeper "
                    "creates a GPUBudget named 'default' there); unset: no budget")] = None,
    budget_default_period: Annotated[str, typer.Option(
        help="the cluster default budget's period (h, m, s: 168h, 1h30m; at least 1m)")
                      ] = "168h",
    budget_refresh_seconds: Annotated[int, typer.Option(
        min=1, help="a GPUBudget's status.used is rewritten at most this often while it "
                    "moves (settling and the over-budget flip are written at once)")] = 30,
    budget_min_write_seconds: Annotated[float, typer.Option(
        min=0, help="at most one GPUBudget status write per namespace this often")] = 1.0,
    only: Annotated[list[str] | None, typer.Option(
        help="run only these controllers (repeatable; default: all)")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="the controllers' settings (YAML; `mig:` the MIG adapter's: "
        "namespaces, substitutions, moveBack; docs/mig-adapter.md; `defrag:` the "
        "defragmentation controller's, off by default: docs/defrag.md)")] = None,
    log_level: LogLevel = "INFO",
    check: Annotated[bool, typer.Option(
        "--check", help="only read and validate --config: print each problem (field, value, "
                        "rule) and exit 2, or say it is valid and exit 0; nothing is started")
    ] = False,
) -> None:
    """Run the controllers (claims: binding, provisioning, reclaim, claim protection; mig: the
    MIG adapter; budgets: the namespaces' GPU-time ledger in their GPUBudgets; defrag: room
    for pending pods by moving movable shares, off unless --config enables it), leader-elected
    on a coordination.k8s.io Lease. SIGTERM/SIGINT stop the workers and release the Lease;
    losing it exits with code 1."""
    from elastic_gpu.api.config.loader import ConfigError
    from elastic_gpu.controller.config import load_config

    if check:
        check_config("egpu controller", config, load_config)
        return
    from elastic_gpu.api.budget import BudgetObjectError, parse_duration
    from elastic_gpu.controller.manager import (
        BudgetSettings,
        ManagerOptions,
        default_identity,
        serve,
    )
    from elastic_gpu.controller.provisioning import TLSOptions
    from elastic_gpu.controller.registry import CONTROLLERS
    from elastic_gpu.core.budget import MIN_PERIOD_S
    from elastic_gpu.kube.kubeconfig import ClientConfigError
    from elastic_gpu.kube.leaderelection import LeaseConfig
    from elastic_gpu.runtime import eventloop

    start_logging("egpu controller", log_level)
    if (extender_client_cert is None) != (extender_client_key is None):
        typer.echo("error: --extender-client-cert and --extender-client-key go together", err=True)
        raise typer.Exit(2)
    if backoff_max < backoff_base:
        typer.echo("error: --backoff-max must be >= --backoff-base", err=True)
        raise typer.Exit(2)
    unknown = sorted(set(only or []) - set(CONTROLLERS))
    if unknown:
        typer.echo(f"error: --only {unknown}: known controllers are {sorted(CONTROLLERS)}",
                   err=True)
        raise typer.Exit(2)
    try:
        settings = load_config(config)
    except ConfigError as err:
        typer.echo(f"error: --config {err}", err=True)
        raise typer.Exit(2) from None
    try:
        parse_duration(budget_default_period, "--budget-default-period", MIN_PERIOD_S)
    except BudgetObjectError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    budget = BudgetSettings(budget_default_gpu_hours, budget_default_period,
                            refresh_s=budget_refresh_seconds,
                            min_write_s=budget_min_write_seconds)
    try:
        lease = LeaseConfig(lease_namespace, lease_name, identity or default_identity(),
                            lease_duration, renew_deadline, retry_period)
        tls = TLSOptions(extender_ca, extender_client_cert, extender_client_key)
        tls.context()  # unreadable files fail here, with their reason
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    options = ManagerOptions(
        kubeconfig=kubeconfig, lease=lease, extender_url=extender_url, extender_tls=tls,
        metrics_host=metrics_host, metrics_port=metrics_port, workers=workers,
        backoff=(backoff_base, backoff_max), controllers=tuple(only or ()), config=settings,
        budget=budget)
    try:
        code = eventloop.run(serve(options, CONTROLLERS))
    except ClientConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
