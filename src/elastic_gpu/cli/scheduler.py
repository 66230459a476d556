"""`egpu scheduler`: the kube-scheduler extender (owned by the scheduler part)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer


def scheduler(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="kubeconfig file; without it, the in-cluster service account")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to serve on")] = 8888,
    host: Annotated[str, typer.Option(help="address to listen on")] = "0.0.0.0",
    config: Annotated[Path | None, typer.Option(
        help="YAML: nodePolicy, cardPolicy, reservationTTLSeconds, seed, filterResult, "
             "targetWorkload, workloadRefreshPods (docs/scheduler.md)")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="serve HTTPS with this certificate")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="private key of --tls-cert")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize, bind, preempt)."""
    from elastic_gpu.k8s.client import ClientConfigError
    from elastic_gpu.scheduler import eventloop
    from elastic_gpu.scheduler.app import ServeOptions, serve
    from elastic_gpu.scheduler.config import ConfigError, load_config

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # one INFO line per API request would drown the scheduler's own messages
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    if (tls_cert is None) != (tls_key is None):
        typer.echo("error: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    try:
        settings = load_config(config)
        options = ServeOptions(host=host, port=port, tls_cert=tls_cert, tls_key=tls_key)
        eventloop.run(serve(kubeconfig, settings, options))
    except (ConfigError, ClientConfigError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass
