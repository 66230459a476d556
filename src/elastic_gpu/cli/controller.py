"""`egpu controller`: every controller of the project in one leader-elected process."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.api.config.merge import Override
from elastic_gpu.cli.check import check_config
from elastic_gpu.cli.options import LogLevel, start_logging

#: Every flag that sets a ControllerConfig key, and the key (dotted path): a flag given beats
#: the file's value, which beats the model's default (`api.config.merge`). The flags have no
#: defaults of their own: the model holds each.
FLAG_KEYS = {
    "--only": "controllers",
    "--workers": "workers",
    "--backoff-base": "backoff.baseSeconds",
    "--backoff-max": "backoff.maxSeconds",
    "--lease-namespace": "leaderElection.leaseNamespace",
    "--lease-name": "leaderElection.leaseName",
    "--lease-duration": "leaderElection.leaseDurationSeconds",
    "--renew-deadline": "leaderElection.renewDeadlineSeconds",
    "--retry-period": "leaderElection.retryPeriodSeconds",
    "--metrics-host": "metrics.host",
    "--metrics-port": "metrics.port",
    "--extender-url": "extender.url",
    "--extender-ca": "extender.caFile",
    "--extender-client-cert": "extender.clientCertFile",
    "--extender-client-key": "extender.clientKeyFile",
    "--budget-default-gpu-hours": "budgets.defaultGPUHours",
    "--budget-default-period": "budgets.defaultPeriod",
    "--budget-refresh-seconds": "budgets.refreshSeconds",
    "--budget-min-write-seconds": "budgets.minWriteSeconds",
}


def _key(flag: str, what: str) -> str:
    """A key-setting flag's help: what it is and the key it sets."""
    return f"{what} (config {FLAG_KEYS[flag]}; given, it beats the file's value)"


def controller(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="kubeconfig file; without it, the in-cluster service account")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="the controllers' settings (YAML, ControllerConfig: controllers, "
        "workers, backoff, leaderElection, metrics, extender, budgets, mig, defrag; "
        "docs/config.md). Each flag below sets one of its keys: a flag given "
        "beats the file, the file beats the default")] = None,
    identity: Annotated[str | None, typer.Option(
        help="this replica's Lease holder identity (default hostname_pid): unique among live "
             "replicas; the same across restarts of one (a pod's name) lets a restarted "
             "leader renew its Lease at once instead of waiting for it to expire")] = None,
    extender_url: Annotated[str | None, typer.Option(help=_key(
        "--extender-url", "the extender (`egpu scheduler`) whose POST /provision chooses the "
        "cards of Immediate claims"))] = None,
    extender_ca: Annotated[str | None, typer.Option(help=_key(
        "--extender-ca", "verify the extender's HTTPS certificate with this CA"))] = None,
    extender_client_cert: Annotated[str | None, typer.Option(help=_key(
        "--extender-client-cert", "client certificate presented to the extender (its "
        "--tls-client-ca)"))] = None,
    extender_client_key: Annotated[str | None, typer.Option(help=_key(
        "--extender-client-key", "private key of --extender-client-cert"))] = None,
    lease_namespace: Annotated[str | None, typer.Option(envvar="POD_NAMESPACE", help=_key(
        "--lease-namespace", "namespace of the leader-election Lease"))] = None,
    lease_name: Annotated[str | None, typer.Option(help=_key(
        "--lease-name", "name of the Lease"))] = None,
    lease_duration: Annotated[float | None, typer.Option(help=_key(
        "--lease-duration", "seconds a Lease not renewed stays valid for the others"))] = None,
    renew_deadline: Annotated[float | None, typer.Option(help=_key(
        "--renew-deadline", "seconds the leader retries renewing before it gives up (and "
        "exits)"))] = None,
    retry_period: Annotated[float | None, typer.Option(help=_key(
        "--retry-period", "seconds between acquire / renew attempts"))] = None,
    metrics_host: Annotated[str | None, typer.Option(help=_key(
        "--metrics-host", "address of /metrics, /healthz, /readyz"))] = None,
    metrics_port: Annotated[int | None, typer.Option(help=_key(
        "--metrics-port", "port of /metrics, /healthz, /readyz"))] = None,
    workers: Annotated[int | None, typer.Option(help=_key(
        "--workers", "concurrent reconciles per controller"))] = None,
    backoff_base: Annotated[float | None, typer.Option(help=_key(
        "--backoff-base", "first retry delay of a failed key, seconds (doubles each time)"))
    ] = None,
    backoff_max: Annotated[float | None, typer.Option(help=_key(
        "--backoff-max", "longest retry delay, seconds"))] = None,
    budget_default_gpu_hours: Annotated[float | None, typer.Option(help=_key(
        "--budget-default-gpu-hours", "the cluster default budget: GPU-hours per "
        "--budget-default-period for every namespace that runs GPU pods and has no GPUBudget "
        "(the keeper creates a GPUBudget named 'default' there); unset: no budget"))] = None,
    budget_default_period: Annotated[str | None, typer.Option(help=_key(
        "--budget-default-period", "the cluster default budget's period (h, m, s: 168h, "
        "1h30m; at least 1m)"))] = None,
    budget_refresh_seconds: Annotated[int | None, typer.Option(help=_key(
        "--budget-refresh-seconds", "a GPUBudget's status.used is rewritten at most this "
        "often while it moves (settling and the over-budget flip are written at once)"))
    ] = None,
    budget_min_write_seconds: Annotated[float | None, typer.Option(help=_key(
        "--budget-min-write-seconds", "at most one GPUBudget status write per namespace "
        "this often"))] = None,
    only: Annotated[list[str] | None, typer.Option(help=_key(
        "--only", "run only these controllers (repeatable; default: all)"))] = None,
    log_level: LogLevel = "INFO",
    check: Annotated[bool, typer.Option(
        "--check", help="only read and validate --config (with the flags given on top): print "
                        "each problem (field, value, rule) and exit 2, or say it is valid and "
                        "exit 0; nothing is started")
    ] = False,
) -> None:
    """Run the controllers (claims: binding, provisioning, reclaim, claim protection; mig: the
    MIG adapter; budgets: the namespaces' GPU-time ledger in their GPUBudgets; defrag: room
    for pending pods by moving movable shares, off unless --config enables it; mig-dynamic:
    carves and merges back the cards of nodes labelled elasticgpu.io/mig-dynamic=true for the
    MIG and whole-card demand that waits, off unless --config enables it), leader-elected on a
    coordination.k8s.io Lease. SIGTERM/SIGINT stop the workers and release the Lease;
    losing it exits with code 1."""
    from elastic_gpu.api.config.loader import ConfigError
    from elastic_gpu.controller.config import load_config

    flags = {
        "--only": only or None, "--workers": workers, "--backoff-base": backoff_base,
        "--backoff-max": backoff_max, "--lease-namespace": lease_namespace,
        "--lease-name": lease_name, "--lease-duration": lease_duration,
        "--renew-deadline": renew_deadline, "--retry-period": retry_period,
        "--metrics-host": metrics_host, "--metrics-port": metrics_port,
        "--extender-url": extender_url, "--extender-ca": extender_ca,
        "--extender-client-cert": extender_client_cert,
        "--extender-client-key": extender_client_key,
        "--budget-default-gpu-hours": budget_default_gpu_hours,
        "--budget-default-period": budget_default_period,
        "--budget-refresh-seconds": budget_refresh_seconds,
        "--budget-min-write-seconds": budget_min_write_seconds,
    }
    overrides = [Override(FLAG_KEYS[flag], flag, value) for flag, value in flags.items()]
    if check:
        check_config("egpu controller", config, lambda path: load_config(path, overrides))
        return
    from elastic_gpu.controller.manager import ManagerOptions, default_identity, serve
    from elastic_gpu.controller.provisioning import TLSOptions
    from elastic_gpu.controller.registry import CONTROLLERS
    from elastic_gpu.kube.kubeconfig import ClientConfigError
    from elastic_gpu.kube.leaderelection import LeaseConfig
    from elastic_gpu.runtime import eventloop

    start_logging("egpu controller", log_level)
    try:
        settings = load_config(config, overrides)
    except ConfigError as err:
        what = "--config " if config is not None else ""
        typer.echo(f"error: {what}{err}", err=True)
        raise typer.Exit(2) from None
    election, extender = settings.leader_election, settings.extender
    try:
        lease = LeaseConfig(election.lease_namespace, election.lease_name,
                            identity or default_identity(), election.lease_duration_s,
                            election.renew_deadline_s, election.retry_period_s)
        tls = TLSOptions(*(None if f is None else Path(f) for f in (
            extender.ca_file, extender.client_cert_file, extender.client_key_file)))
        tls.context()  # unreadable files fail here, with their reason
    except (ValueError, OSError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    options = ManagerOptions(kubeconfig=kubeconfig, lease=lease, extender_tls=tls,
                             config=settings)
    try:
        code = eventloop.run(serve(options, CONTROLLERS))
    except ClientConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)
