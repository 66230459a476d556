"""`egpu webhook`: the admission webhook (validating and mutating AdmissionReview v1)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from elastic_gpu.api.config.merge import Override
from elastic_gpu.cli.check import check_config
from elastic_gpu.cli.options import LogLevel, start_logging

#: Every flag that sets a WebhookConfig key, and the key: a flag given beats the file's
#: value, which beats the model's default (`api.config.merge`). The flags have no defaults of
#: their own: the model (`webhook.config.WebhookConfig`) holds each.
FLAG_KEYS = {
    "--host": "host",
    "--port": "port",
    "--namespace": "namespace",
    "--name": "name",
    "--register": "register",
    "--service": "service",
    "--service-port": "servicePort",
    "--url": "url",
    "--timeout-seconds": "timeoutSeconds",
    "--namespace-label": "namespaceLabels",
    "--secret": "secret",
    "--cert-dir": "certDirectory",
    "--ca-days": "caDays",
    "--cert-days": "certDays",
    "--rotation-check-seconds": "rotationCheckSeconds",
    "--header-timeout-seconds": "headerTimeoutSeconds",
    "--body-timeout-seconds": "bodyTimeoutSeconds",
    "--idle-timeout-seconds": "idleTimeoutSeconds",
    "--max-connections": "maxConnections",
    "--over-budget-priority-class": "overBudgetPriorityClass",
    "--budget-finalizer": "budgetFinalizer",
    "--quota-resources": "quotaResources",
}


def _key(flag: str, what: str) -> str:
    """A key-setting flag's help: what it is and the key it sets."""
    return f"{what} (config {FLAG_KEYS[flag]}; given, it beats the file's value)"


def webhook(
    kubeconfig: Annotated[Path | None, typer.Option(
        help="kubeconfig file; without it, the in-cluster service account")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="the webhook's settings (YAML, WebhookConfig; docs/config.md, "
        "docs/webhook.md). Each flag below sets one of its keys: a flag given beats the file, "
        "the file beats the default")] = None,
    port: Annotated[int | None, typer.Option(help=_key("--port", "HTTPS port to serve on "
                                                       "(default 9443)"))] = None,
    host: Annotated[str | None, typer.Option(help=_key("--host", "address to listen on "
                                                       "(default 127.0.0.1)"))] = None,
    namespace: Annotated[str | None, typer.Option(envvar="POD_NAMESPACE", help=_key(
        "--namespace", "the webhook's namespace: its Secret lives here, and its pods are never "
        "sent to it (default elastic-gpu)"))] = None,
    name: Annotated[str | None, typer.Option(help=_key(
        "--name", "name of the Mutating/ValidatingWebhookConfiguration (default "
        "elastic-gpu-webhook)"))] = None,
    secret: Annotated[str | None, typer.Option(help=_key(
        "--secret", "Secret holding the CA and serving certificate, shared by replicas "
        "(default elastic-gpu-webhook-tls)"))] = None,
    service: Annotated[str | None, typer.Option(help=_key(
        "--service", "in a cluster: the Service kube-apiserver calls (else --url)"))] = None,
    service_port: Annotated[int | None, typer.Option(help=_key(
        "--service-port", "the Service's port (default 443)"))] = None,
    url: Annotated[str | None, typer.Option(help=_key(
        "--url", "the https URL kube-apiserver calls when there is no Service (default "
        "https://HOST:PORT of --host and --port, e.g. the dev cluster on loopback)"))] = None,
    register: Annotated[bool | None, typer.Option("--register/--no-register", help=_key(
        "--register", "create/update the webhook configurations (with their caBundle) at start "
        "(default on)"))] = None,
    cert_dir: Annotated[Path | None, typer.Option(help=_key(
        "--cert-dir", "use tls.crt, tls.key and ca.crt from this directory (cert-manager's "
        "Secret, mounted) instead of making and rotating our own; re-read when they change"))
    ] = None,
    ca_days: Annotated[float | None, typer.Option(help=_key(
        "--ca-days", "CA lifetime, days (default 3650)"))] = None,
    cert_days: Annotated[float | None, typer.Option(help=_key(
        "--cert-days", "serving certificate lifetime, days, renewed with a third left "
        "(default 365)"))] = None,
    rotation_check_seconds: Annotated[float | None, typer.Option(help=_key(
        "--rotation-check-seconds", "how often the certificates (and the Secret) are checked "
        "(default 60)"))] = None,
    timeout_seconds: Annotated[int | None, typer.Option(help=_key(
        "--timeout-seconds", "the configurations' timeoutSeconds, 1-30 (default 5)"))] = None,
    header_timeout_seconds: Annotated[float | None, typer.Option(help=_key(
        "--header-timeout-seconds", "a connection must finish its TLS handshake and send a "
        "request's headers within this (default 32, kube-apiserver's own)"))] = None,
    body_timeout_seconds: Annotated[float | None, typer.Option(help=_key(
        "--body-timeout-seconds", "a request's whole body must arrive within this of its "
        "headers, or it is answered 408 and the connection closed (default 60, "
        "kube-apiserver's request timeout)"))] = None,
    idle_timeout_seconds: Annotated[float | None, typer.Option(help=_key(
        "--idle-timeout-seconds", "a connection with no request in progress is closed after "
        "this (default 90, kube-apiserver's own)"))] = None,
    max_connections: Annotated[int | None, typer.Option(help=_key(
        "--max-connections", "connections open at once, lowered to fit the file-descriptor "
        "limit; the oldest idle ones make room for a new one, which is refused only when all "
        "are busy (default 1024)"))] = None,
    namespace_label: Annotated[list[str] | None, typer.Option(help=_key(
        "--namespace-label", "KEY=VALUE: only namespaces with this label are sent "
        "(repeatable; given, the flags replace the file's labels)"))] = None,
    over_budget_priority_class: Annotated[str | None, typer.Option(help=_key(
        "--over-budget-priority-class", "the PriorityClass GPU pods of a namespace over its "
        "GPU budget get (a GPUBudget's spec.overBudgetPriorityClassName overrides it); '' "
        "turns the lookups off (default egpu-over-budget)"))] = None,
    budget_finalizer: Annotated[bool | None, typer.Option(
        "--budget-finalizer/--no-budget-finalizer", help=_key(
            "--budget-finalizer", "give the GPU pods of namespaces with a GPUBudget the budget "
            "keeper's finalizer (elasticgpu.io/budget), so no pod's GPU time is lost while "
            "`egpu controller` is down; other namespaces' pods get none; run the keeper with "
            "it (default off)"))] = None,
    quota_resources: Annotated[bool | None, typer.Option(
        "--quota-resources/--no-quota-resources", help=_key(
            "--quota-resources", "add the canonical quota resources "
            "quota.elasticgpu.io/gpu-core|gpu-memory to GPU containers (ResourceQuota in "
            "canonical units); kube-scheduler must ignore them (extender managedResources "
            "ignoredByScheduler) (default off)"))] = None,
    log_level: LogLevel = "INFO",
    check: Annotated[bool, typer.Option(
        "--check", help="only read and validate --config (with the flags given on top): print "
                        "each problem (field, value, rule) and exit 2, or say it is valid and "
                        "exit 0; nothing is started")
    ] = False,
) -> None:
    """Serve the admission webhook: validate GPU pods and claims against the resource table and
    the cluster, and mutate them (defaults, gpu-manager's annotations, HAMi's, KAI's, Volcano's
    and Koordinator's names read as ours, MIG rules, budgets, the quota's names, the DRA
    placement gate). SIGTERM stops it."""
    from elastic_gpu.api.config.loader import ConfigError
    from elastic_gpu.kube.kubeconfig import ClientConfigError
    from elastic_gpu.runtime import eventloop
    from elastic_gpu.webhook.certs import Lifetimes
    from elastic_gpu.webhook.config import load_config
    from elastic_gpu.webhook.server import WebhookOptions, WebhookStartError, serve

    labels: dict[str, str] | None = None
    if namespace_label:
        labels = {}
        for item in namespace_label:
            key, sep, value = item.partition("=")
            if not sep or not key:
                typer.echo(f"error: --namespace-label {item!r}: expected KEY=VALUE", err=True)
                raise typer.Exit(2)
            labels[key] = value
    flags = {
        "--host": host, "--port": port, "--namespace": namespace, "--name": name,
        "--register": register, "--service": service, "--service-port": service_port,
        "--url": url, "--timeout-seconds": timeout_seconds, "--namespace-label": labels,
        "--secret": secret, "--cert-dir": None if cert_dir is None else str(cert_dir),
        "--ca-days": ca_days, "--cert-days": cert_days,
        "--rotation-check-seconds": rotation_check_seconds,
        "--header-timeout-seconds": header_timeout_seconds,
        "--body-timeout-seconds": body_timeout_seconds,
        "--idle-timeout-seconds": idle_timeout_seconds, "--max-connections": max_connections,
        "--over-budget-priority-class": over_budget_priority_class,
        "--budget-finalizer": budget_finalizer, "--quota-resources": quota_resources,
    }
    overrides = [Override(FLAG_KEYS[flag], flag, value) for flag, value in flags.items()]
    if check:
        check_config("egpu webhook", config, lambda path: load_config(path, overrides))
        return
    start_logging("egpu webhook", log_level, quiet=("httpx2",))
    try:
        settings = load_config(config, overrides)
    except ConfigError as err:
        what = "--config " if config is not None else ""
        typer.echo(f"error: {what}{err}", err=True)
        raise typer.Exit(2) from None
    if settings.cert_dir is not None and not (settings.cert_dir / "tls.crt").is_file():
        typer.echo(f"error: --cert-dir (certDirectory) {settings.cert_dir}: no tls.crt there",
                   err=True)
        raise typer.Exit(2)
    options = WebhookOptions(
        kubeconfig=kubeconfig, host=settings.host, port=settings.port,
        namespace=settings.namespace, name=settings.name, secret_name=settings.secret,
        service_name=settings.service, service_port=settings.service_port, url=settings.url,
        register=settings.register_configurations, cert_dir=settings.cert_dir,
        lifetimes=Lifetimes(ca=dt.timedelta(days=settings.ca_days),
                            serving=dt.timedelta(days=settings.cert_days)),
        rotation_check_s=settings.rotation_check_s, timeout_s=settings.timeout_s,
        namespace_labels=dict(settings.namespace_labels),
        over_budget_class=settings.over_budget_priority_class or None,
        budget_finalizer=settings.budget_finalizer, quota=settings.quota_resources,
        connection_limits=settings.connection_limits)
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
