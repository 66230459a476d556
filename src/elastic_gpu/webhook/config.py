"""`egpu webhook --config FILE`: every setting of the admission webhook (YAML, kind
WebhookConfig), validated strictly by the one loader (`api.config.loader`). Each flag of `egpu
webhook` sets one key (`cli/webhook.py`, `FLAG_KEYS`): a flag given beats the file, the file
beats the default below (`api.config.merge`, the same rule for every component; docs/config.md).

    apiVersion: elasticgpu.io/v1alpha1  # optional header
    kind: WebhookConfig
    host: 127.0.0.1                    # address to listen on (--host)
    port: 9443                         # HTTPS port (--port)
    namespace: elastic-gpu             # its Secret's namespace; its pods are never sent to it
                                       #   (--namespace, or POD_NAMESPACE)
    name: elastic-gpu-webhook          # the Mutating/ValidatingWebhookConfiguration (--name)
    register: true                     # create/update them (and their caBundle) at start
                                       #   (--register / --no-register)
    service: null                      # the Service kube-apiserver calls (--service)
    servicePort: 443                   # (--service-port)
    url: null                          # https URL called when there is no Service (--url)
    timeoutSeconds: 5                  # the configurations' timeoutSeconds (--timeout-seconds)
    namespaceLabels: {}                # only namespaces with these labels are sent
                                       #   (--namespace-label KEY=VALUE, repeatable)
    secret: elastic-gpu-webhook-tls    # the CA and serving certificate (--secret)
    certDirectory: null                # tls.crt, tls.key, ca.crt from here instead (--cert-dir)
    caDays: 3650                       # CA lifetime (--ca-days)
    certDays: 365                      # serving certificate lifetime (--cert-days)
    rotationCheckSeconds: 60           # (--rotation-check-seconds)
    headerTimeoutSeconds: 32           # handshake and headers within this (--header-timeout-seconds)
    bodyTimeoutSeconds: 60             # a request's body within this of its headers, or 408
                                       #   (--body-timeout-seconds)
    idleTimeoutSeconds: 90             # an idle connection is closed after this
                                       #   (--idle-timeout-seconds)
    maxConnections: 1024               # (--max-connections)
    overBudgetPriorityClass: egpu-over-budget  # '': no budget lookups
                                       #   (--over-budget-priority-class)
    budgetFinalizer: false             # (--budget-finalizer)
    quotaResources: false              # (--quota-resources)

Without `--config`, every default (and the flags given). A bad file or flag stops the webhook
at start with the file, the field (a flag's by its name), the value and the rule (exit code 2),
as the other components' `--config` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import ConfigDict, Field, field_validator

from elastic_gpu.api.config.connections import ConnectionLimitSettings
from elastic_gpu.api.config.loader import load_settings
from elastic_gpu.api.config.merge import Override

KIND = "WebhookConfig"


class WebhookConfig(ConnectionLimitSettings):
    """Every setting of `egpu webhook` but the process's own (kubeconfig, log level): the
    file's, with the flags given on top (`cli/webhook.py`, `FLAG_KEYS`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    host: str = "127.0.0.1"
    port: int = Field(default=9443, ge=1, le=65535)
    namespace: str = Field(default="elastic-gpu", min_length=1)
    name: str = Field(default="elastic-gpu-webhook", min_length=1)
    #: `register` (a BaseModel attribute's name: the field is spelled out)
    register_configurations: bool = Field(default=True, validation_alias="register")
    service: str | None = None
    service_port: int = Field(default=443, validation_alias="servicePort", ge=1, le=65535)
    url: str | None = None
    timeout_s: int = Field(default=5, validation_alias="timeoutSeconds", ge=1, le=30)
    namespace_labels: dict[str, str] = Field(default_factory=dict,
                                             validation_alias="namespaceLabels")
    secret: str = Field(default="elastic-gpu-webhook-tls", min_length=1)
    cert_directory: str | None = Field(default=None, validation_alias="certDirectory")
    ca_days: float = Field(default=3650.0, validation_alias="caDays", ge=0.0001, le=36500)
    cert_days: float = Field(default=365.0, validation_alias="certDays", ge=0.0001, le=36500)
    rotation_check_s: float = Field(default=60.0, validation_alias="rotationCheckSeconds",
                                    ge=0.1, le=86400)
    #: '': budgets are not looked up (no downgrades)
    over_budget_priority_class: str = Field(default="egpu-over-budget",
                                            validation_alias="overBudgetPriorityClass")
    budget_finalizer: bool = Field(default=False, validation_alias="budgetFinalizer")
    quota_resources: bool = Field(default=False, validation_alias="quotaResources")

    @field_validator("url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("https://"):
            raise ValueError("kube-apiserver calls webhooks over https only: must be an "
                             "https:// URL")
        return value

    @field_validator("namespace_labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if any(not key for key in value):
            raise ValueError("a label key may not be empty")
        return value

    @property
    def cert_dir(self) -> Path | None:
        return None if self.cert_directory is None else Path(self.cert_directory)


def load_config(path: Path | None, flags: Iterable[Override] = ()) -> WebhookConfig:
    """The webhook's settings: `path`'s (None: all defaults) with the given `flags` on top;
    `ConfigError` naming the file, each field (a flag's by its name), value and rule."""
    return load_settings(path, WebhookConfig, KIND, overrides=flags)
