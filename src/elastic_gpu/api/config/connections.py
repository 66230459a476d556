"""The connection limits of every component that serves HTTPS to kube-apiserver or
kube-scheduler (the extender's SchedulerConfig, the webhook's WebhookConfig): one set of keys
and ranges, read by `runtime.http_connections` (docs/scheduler.md, "HTTP limits")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from elastic_gpu.core.connlimits import ConnectionLimits


class ConnectionLimitSettings(BaseModel):
    """A component's settings model subclasses it for these four keys (kube-apiserver's own
    defaults: 32 s to a request's headers, 60 s to its body, 90 s idle)."""

    # strict: a number is a YAML number and a string a YAML string; "30" is not 30.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    header_timeout_s: float = Field(default=32.0, validation_alias="headerTimeoutSeconds",
                                    ge=0.001, le=3600)
    idle_timeout_s: float = Field(default=90.0, validation_alias="idleTimeoutSeconds",
                                  ge=0.001, le=86400)
    max_connections: int = Field(default=1024, validation_alias="maxConnections", ge=1,
                                 le=1_000_000)
    body_timeout_s: float = Field(default=60.0, validation_alias="bodyTimeoutSeconds",
                                  ge=0.001, le=3600)

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(self.header_timeout_s, self.idle_timeout_s, self.max_connections,
                                self.body_timeout_s)
