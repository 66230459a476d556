"""`egpu webhook`: the admission webhook (validating and mutating AdmissionReview v1)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.cli.options import LogLevel, start_logging


def webhook(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="kubeconfig file; without it, the in-cluster service account")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTPS port to serve on")] = 9443,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    namespace: Annotated[str, typer.Option(
        envvar="POD_NAMESPACE",
        help="the webhook's namespace: its Secret lives here, and its pods are never sent to "
             "it")] = "elastic-gpu",
    name: Annotated[str, typer.Option(
        help="name of the Mutating/ValidatingWebhookConfiguration")] = "elastic-gpu-webhook",
    secret: Annotated[str, typer.Option(
        help="Secret holding the CA and serving certificate (shared by replicas)")
    ] = "elastic-gpu-webhook-tls",
    service: Annotated[str | None, typer.Option(
        help="in a cluster: the Service kube-apiserver calls (else --url)")] = None,
    service_port: Annotated[int, typer.Option(help="the Service's port")] = 443,
    url: Annotated[str | None, typer.Option(
        help="the https URL kube-apiserver calls when there is no Service (default "
             "https://<host>:<port>, e.g. the dev cluster on loopback)")] = None,
    register: Annotated[bool, typer.Option(
        help="create/update the webhook configurations (with their caBundle) at start")] = True,
    cert_dir: Annotated[Path | None, typer.Option(
        help="use tls.crt, tls.key and ca.crt from this directory (cert-manager's Secret, "
             "mounted) instead of making and rotating our own; re-read when they change")
    ] = None,
    ca_days: Annotated[float, typer.Option(min=0.0001, help="CA lifetime, days")] = 3650,
    cert_days: Annotated[float, typer.Option(min=0.0001, help="serving certificate lifetime, "
                                             "days (renewed with a third left)")] = 365,
    rotation_check_seconds: Annotated[float, typer.Option(
        min=0.1, help="how often the certificates (and the Secret) are checked")] = 60.0,
    timeout_seconds: Annotated[int, typer.Option(
        min=1, max=30, help="the configurations' timeoutSeconds")] = 5,
    header_timeout_seconds: Annotated[float, typer.Option(
        min=0.001, max=3600, help="a connection must finish its TLS handshake and send a "
                                  "request's headers within this (kube-apiserver's own: 32)")
    ] = 32.0,
    idle_timeout_seconds: Annotated[float, typer.Option(
        min=0.001, max=86400, help="a connection with no request in progress is closed after "
                                   "this (kube-apiserver's own: 90)")] = 90.0,
    max_connections: Annotated[int, typer.Option(
        min=1, max=1_000_000, help="connections open at once (lowered to fit the "
                                   "file-descriptor limit); the oldest idle ones make room for "
                                   "a new one, which is refused only when all are busy")] = 1024,
    namespace_label: Annotated[list[str] | None, typer.Option(
        help="KEY=VALUE: only namespaces with this label are sent (repeatable)")] = None,
    over_budget_priority_class: Annotated[str, typer.Option(
        help="the PriorityClass GPU pods of a namespace over its GPU budget get (a GPUBudget's "
             "spec.overBudgetPriorityClassName overrides it); '' turns the lookups off")
    ] = "egpu-over-budget",
    budget_finalizer: Annotated[bool, typer.Option(
        help="give the GPU pods of namespaces with a GPUBudget the budget keeper's finalizer "
             "(elasticgpu.io/budget), so no pod's GPU time is lost while `egpu controller` is "
             "down; other namespaces' pods get none; run the keeper with it")
    ] = False,
    quota_resources: Annotated[bool, typer.Option(
        help="add the canonical quota resources quota.elasticgpu.io/gpu-core|gpu-memory to GPU "
             "containers (ResourceQuota in canonical units); kube-scheduler must ignore them "
             "(extender managedResources ignoredByScheduler)")] = False,
    log_level: LogLevel = "INFO",
) -> None:
    """Serve the admission webhook: validate GPU pods against the resource table and the
    cluster, and mutate them (defaults, gpu-manager's annotations). SIGTERM stops it."""
    from elastic_gpu.core.connlimits import ConnectionLimits
    from elastic_gpu.kube.kubeconfig import ClientConfigError
    from elastic_gpu.runtime import eventloop
    from elastic_gpu.webhook.certs import Lifetimes
    from elastic_gpu.webhook.server import WebhookOptions, WebhookStartError, serve

    start_logging("egpu webhook", log_level, quiet=("httpx2",))
    labels: dict[str, str] = {}
    for item in namespace_label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            typer.echo(f"error: --namespace-label {item!r}: expected KEY=VALUE", err=True)
            raise typer.Exit(2)
        labels[key] = value
    if url is not None and not url.startswith("https://"):
        typer.echo(f"error: --url {url!r}: kube-apiserver calls webhooks over https only",
                   err=True)
        raise typer.Exit(2)
    if cert_dir is not None and not (cert_dir / "tls.crt").is_file():
        typer.echo(f"error: --cert-dir {cert_dir}: no tls.crt there", err=True)
        raise typer.Exit(2)
    options = WebhookOptions(
        kubeconfig=kubeconfig, host=host, port=port, namespace=namespace, name=name,
        secret_name=secret, service_name=service, service_port=service_port, url=url,
        register=register, cert_dir=cert_dir,
        lifetimes=Lifetimes(ca=dt.timedelta(days=ca_days), serving=dt.timedelta(days=cert_days)),
        rotation_check_s=rotation_check_seconds, timeout_s=timeout_seconds,
        namespace_labels=labels, over_budget_class=over_budget_priority_class or None,
        budget_finalizer=budget_finalizer, quota=quota_resources,
        connection_limits=ConnectionLimits(header_timeout_seconds, idle_timeout_seconds,
                                           max_connections))
    try:
        eventloop.run(serve(options))
    except ClientConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except WebhookStartError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass  # Ctrl-C before the loop's own handler is in place: a normal stop
