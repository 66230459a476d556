"""`egpu scheduler`: the kube-scheduler extender (owned by the scheduler part)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.api.config.merge import Override
from elastic_gpu.cli.check import check_config
from elastic_gpu.cli.options import LogLevel, start_logging


def scheduler(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="kubeconfig file; without it, the in-cluster service account")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to serve on")] = 8888,
    host: Annotated[str, typer.Option(
        help="address to listen on; loopback by default, as the extender runs beside "
             "kube-scheduler (another address needs --tls-client-ca: /bind writes Bindings)")
    ] = "127.0.0.1",
    config: Annotated[Path | None, typer.Option(
        help="YAML: nodePolicy, cardPolicy, reservationTTLSeconds, seed, filterResult, "
             "targetWorkload, workloadRefreshPods, maxRequestBytes, maxNodesPerRequest, "
             "schedulerNames (the profiles that call this extender: /bind refuses other "
             "pods), headerTimeoutSeconds, idleTimeoutSeconds, maxConnections, leaderElection, "
             "loadAware "
             "(docs/scheduler.md)")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="serve HTTPS with this certificate")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="private key of --tls-cert")] = None,
    tls_client_ca: Annotated[Path | None, typer.Option(
        help="require client certificates signed by this CA (kube-scheduler's extender "
             "tlsConfig certFile/keyFile); needs --tls-cert")] = None,
    drain_seconds: Annotated[float, typer.Option(
        min=0, max=300, help="on SIGTERM: stop accepting, then wait this long at most for "
                             "binds in progress")] = 10.0,
    leader_elect: Annotated[bool, typer.Option(
        "--leader-elect", help="turn leaderElection on (its other settings from --config, "
                               "else their defaults): several replicas, one serving")] = False,
    identity: Annotated[str | None, typer.Option(
        help="this replica's Lease holder identity with leaderElection.enabled (default "
             "hostname_pid): unique among live replicas (the chart passes the pod's name)")
    ] = None,
    health_port: Annotated[int, typer.Option(
        min=0, max=65535, help="also serve /healthz and /readyz over plain HTTP on this port "
                               "(kubelet's probes, when --tls-client-ca makes the main port "
                               "require client certificates); 0: not at all")] = 0,
    log_level: LogLevel = "INFO",
    check: Annotated[bool, typer.Option(
        "--check", help="only read and validate --config: print each problem (field, value, "
                        "rule) and exit 2, or say it is valid and exit 0; nothing is started")
    ] = False,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize, bind, preempt).

    SIGTERM (or SIGINT) drains: the listener closes, binds in progress finish (at most
    --drain-seconds), and the process exits 0. With leaderElection.enabled in --config, only
    the replica holding the Lease serves; one that loses it stops serving at once and exits 1
    (docs/scheduler.md, "High availability").
    """
    from elastic_gpu.api.config.loader import ConfigError
    from elastic_gpu.scheduler.config import load_config

    # a flag given beats the file (`api.config.merge`); --leader-elect is only ever "on"
    flags = [Override("leaderElection.enabled", "--leader-elect", True if leader_elect else None)]
    if check:
        check_config("egpu scheduler", config, lambda path: load_config(path, flags))
        return
    from elastic_gpu.kube.kubeconfig import ClientConfigError
    from elastic_gpu.runtime import eventloop, gcpolicy
    from elastic_gpu.scheduler.app import ServeOptions, TLSFilesError, serve, tls_context
    from elastic_gpu.scheduler.leadership import LeadershipLost

    # one INFO line per API request would drown the scheduler's own messages
    start_logging("egpu scheduler", log_level, quiet=("httpx2",))
    if (tls_cert is None) != (tls_key is None):
        typer.echo("error: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    if tls_client_ca is not None and tls_cert is None:
        typer.echo("error: --tls-client-ca needs --tls-cert and --tls-key (HTTPS)", err=True)
        raise typer.Exit(2)
    try:
        settings = load_config(config, flags)
        options = ServeOptions(host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
                               tls_client_ca=tls_client_ca, drain_s=drain_seconds,
                               health_port=health_port, identity=identity or "")
        tls_context(options)  # unreadable or mismatched files fail here, with their reason
        gcpolicy.freeze_survivors()  # the state's objects out of full collections' way
        eventloop.run(serve(kubeconfig, settings, options))
    except (ConfigError, ClientConfigError, TLSFilesError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except LeadershipLost as err:
        typer.echo(f"error: leadership lost: {err}; exiting so that this replica comes back as "
                   "a standby", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass
