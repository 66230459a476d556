"""`egpu scheduler`: the kube-scheduler extender (owned by the scheduler part)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.api.config.merge import Override
from elastic_gpu.cli.check import check_config
from elastic_gpu.cli.options import LogLevel, start_logging

#: Every flag that sets a SchedulerConfig key, and the key (dotted path): a flag given beats
#: the file's value, which beats the model's default (`api.config.merge`). The flags have no
#: defaults of their own: the model holds each.
FLAG_KEYS = {
    "--host": "host",
    "--port": "port",
    "--health-port": "healthPort",
    "--drain-seconds": "drainSeconds",
    "--tls-cert": "tls.certFile",
    "--tls-key": "tls.keyFile",
    "--tls-client-ca": "tls.clientCAFile",
    "--leader-elect": "leaderElection.enabled",
}


def _key(flag: str, what: str) -> str:
    """A key-setting flag's help: what it is and the key it sets."""
    return f"{what} (config {FLAG_KEYS[flag]}; given, it beats the file's value)"


def scheduler(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="kubeconfig file; without it, the in-cluster service account")] = None,
    port: Annotated[int | None, typer.Option(help=_key(
        "--port", "port to serve on, 8888 by default"))] = None,
    host: Annotated[str | None, typer.Option(help=_key(
        "--host", "address to listen on; loopback (127.0.0.1) by default, as the extender runs "
        "beside kube-scheduler (another address needs --tls-client-ca: /bind writes "
        "Bindings)"))] = None,
    config: Annotated[Path | None, typer.Option(
        help="YAML: nodePolicy, cardPolicy, reservationTTLSeconds, seed, filterResult, "
             "targetWorkload, workloadRefreshPods, maxRequestBytes, maxNodesPerRequest, "
             "schedulerNames (the profiles that call this extender: /bind refuses other "
             "pods), headerTimeoutSeconds, bodyTimeoutSeconds, idleTimeoutSeconds, "
             "maxConnections, leaderElection, "
             "loadAware, draAllocation (DRA claims placed by our engine), host, port, "
             "healthPort, drainSeconds, tls (docs/scheduler.md). Each "
             "flag below that names a key sets it: a flag given beats the file, the file beats "
             "the default")] = None,
    tls_cert: Annotated[str | None, typer.Option(help=_key(
        "--tls-cert", "serve HTTPS with this certificate"))] = None,
    tls_key: Annotated[str | None, typer.Option(help=_key(
        "--tls-key", "private key of --tls-cert"))] = None,
    tls_client_ca: Annotated[str | None, typer.Option(help=_key(
        "--tls-client-ca", "require client certificates signed by this CA (kube-scheduler's "
        "extender tlsConfig certFile/keyFile); needs --tls-cert"))] = None,
    drain_seconds: Annotated[float | None, typer.Option(help=_key(
        "--drain-seconds", "on SIGTERM: stop accepting, then wait this long at most for binds "
        "in progress, 10 by default (0-300)"))] = None,
    leader_elect: Annotated[bool, typer.Option(
        "--leader-elect", help=_key(
            "--leader-elect", "turn leaderElection on (its other settings from --config, else "
            "their defaults): several replicas, one serving"))] = False,
    identity: Annotated[str | None, typer.Option(
        help="this replica's Lease holder identity with leaderElection.enabled (default "
             "hostname_pid): unique among live replicas (the chart passes the pod's name)")
    ] = None,
    health_port: Annotated[int | None, typer.Option(help=_key(
        "--health-port", "also serve /healthz and /readyz over plain HTTP on this port "
        "(kubelet's probes, when --tls-client-ca makes the main port require client "
        "certificates); 0 (the default): not at all"))] = None,
    log_level: LogLevel = "INFO",
    check: Annotated[bool, typer.Option(
        "--check", help="only read and validate --config (with the flags given on top): print "
                        "each problem (field, value, rule) and exit 2, or say it is valid and "
                        "exit 0; nothing is started")
    ] = False,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize, bind, preempt).

    SIGTERM (or SIGINT) drains: the listener closes, binds in progress finish (at most
    drainSeconds), and the process exits 0. With leaderElection.enabled in --config, only
    the replica holding the Lease serves; one that loses it stops serving at once and exits 1
    (docs/scheduler.md, "High availability").
    """
    from elastic_gpu.api.config.loader import ConfigError
    from elastic_gpu.scheduler.config import load_config

    # --leader-elect is only ever "on": not given, the file's leaderElection.enabled stands
    flags = {"--host": host, "--port": port, "--health-port": health_port,
             "--drain-seconds": drain_seconds, "--tls-cert": tls_cert, "--tls-key": tls_key,
             "--tls-client-ca": tls_client_ca, "--leader-elect": True if leader_elect else None}
    overrides = [Override(FLAG_KEYS[flag], flag, value) for flag, value in flags.items()]
    if check:
        check_config("egpu scheduler", config, lambda path: load_config(path, overrides))
        return
    from elastic_gpu.kube.kubeconfig import ClientConfigError
    from elastic_gpu.runtime import eventloop, gcpolicy
    from elastic_gpu.scheduler.app import TLSFilesError, serve, serve_options, tls_context
    from elastic_gpu.scheduler.leadership import LeadershipLost

    # one INFO line per API request would drown the scheduler's own messages
    start_logging("egpu scheduler", log_level, quiet=("httpx2",))
    try:
        settings = load_config(config, overrides)
        options = serve_options(settings, identity or "")
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
