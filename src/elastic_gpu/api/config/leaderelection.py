"""The `leaderElection:` section of every leader-elected component's settings (the extender's
SchedulerConfig, the controllers' ControllerConfig): one set of keys, ranges and timing rules,
each component with its own defaults (`kube.leaderelection.LeaseConfig` is what it builds).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from elastic_gpu.core.names import NameRule, check_name

#: client-go's JitterFactor: the elector's retries wait retry_period * [1, 1.2)
#: (`kube.leaderelection`), so a renew deadline must leave room for one retry, jittered
JITTER = 1.2


class LeaderElectionSettings(BaseModel):
    """The Lease (namespace, name) and its timing; a component subclasses it to give its own
    defaults (client-go's 15/10/2 s here)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    lease_namespace: str = Field(default="kube-system", validation_alias="leaseNamespace")
    lease_name: str = Field(validation_alias="leaseName")
    lease_duration_s: float = Field(default=15.0, validation_alias="leaseDurationSeconds",
                                    ge=1, le=3600)
    renew_deadline_s: float = Field(default=10.0, validation_alias="renewDeadlineSeconds",
                                    gt=0, le=3600)
    retry_period_s: float = Field(default=2.0, validation_alias="retryPeriodSeconds",
                                  ge=0.05, le=600)

    @field_validator("lease_namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        check_name(value, NameRule.LABEL, "leaseNamespace")
        return value

    @field_validator("lease_name")
    @classmethod
    def _lease(cls, value: str) -> str:
        check_name(value, NameRule.SUBDOMAIN, "leaseName")
        return value

    @model_validator(mode="after")
    def _timing(self) -> LeaderElectionSettings:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise ValueError(f"leaseDurationSeconds ({self.lease_duration_s:g}) must exceed "
                             f"renewDeadlineSeconds ({self.renew_deadline_s:g}): a leader "
                             "must stop serving before a standby may take over")
        if not self.renew_deadline_s > JITTER * self.retry_period_s:
            raise ValueError(f"renewDeadlineSeconds ({self.renew_deadline_s:g}) must exceed "
                             f"{JITTER} x retryPeriodSeconds ({self.retry_period_s:g}): at "
                             "least one renewal must fit in it")
        return self
