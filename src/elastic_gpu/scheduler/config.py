"""The extender's own configuration file (YAML), validated strictly.

    nodePolicy: fgdx-auto        # node tier, any name in core's NODE_POLICIES; default: core's
                                 # DEFAULT_NODE_POLICY, as `egpu simulate --policy`
    cardPolicy: fgd-waste        # card tier, any name in core's CARD_POLICIES; default: the one
                                 # the node policy is paired with, as in `egpu simulate`
    reservationTTLSeconds: 30    # how long a bind whose outcome is unknown holds its cards
    seed: 0                      # random policies' seed, for reproducible runs
    filterResult: all            # all: every fitting node (+ prioritize); best: only the engine's choice
    targetWorkload: builtin      # FGD's target workload: builtin, or observed (the live pods' shapes)
    workloadRefreshPods: 200     # observed: rebuild after this many pods came or went
    maxRequestBytes: 16777216    # larger request bodies get 413 (docs/scheduler.md, "HTTP limits")
    maxNodesPerRequest: 20000    # more candidate nodes in one request get 400

Pods override both tiers with the elasticgpu.io/node-policy and elasticgpu.io/card-policy
annotations. Without `cardPolicy` (and without the pod's card-policy annotation) a pod's cards
are chosen by the card tier its node policy is paired with (`core.policies.default_card_policy`,
the same rule `egpu simulate --card-policy auto` uses): the cluster gets the quality the
simulator measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from elastic_gpu.core.policies import DEFAULT_NODE_POLICY
from elastic_gpu.settings_file import load_settings


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names file and field."""


def known_policies(tier: str) -> tuple[str, ...]:
    """Registered policy names of one tier ("node" or "card")."""
    from elastic_gpu.core import policies

    registry = policies.NODE_POLICIES if tier == "node" else policies.CARD_POLICIES
    return tuple(sorted(registry))


def check_policy(tier: str, name: str) -> str:
    names = known_policies(tier)
    if name not in names:
        raise ValueError(f"unknown {tier} policy {name!r}; known: {', '.join(names)}")
    return name


class SchedulerConfig(BaseModel):
    # strict: a number is a YAML number and a string a YAML string; "30" is not 30.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    node_policy: str = Field(default=DEFAULT_NODE_POLICY, validation_alias="nodePolicy")
    #: None: the card tier `node_policy` is paired with (`effective_card_policy`)
    card_policy: str | None = Field(default=None, validation_alias="cardPolicy")
    reservation_ttl_s: float = Field(default=30.0, validation_alias="reservationTTLSeconds", gt=0, le=3600)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    #: "all": filter passes every node with room (kube-scheduler then asks prioritize);
    #: "best": filter passes only the node the engine would choose, so kube-scheduler skips
    #: scoring and the prioritize round trip (docs/scheduler.md, "One round trip per pod").
    filter_result: Literal["all", "best"] = Field(default="all", validation_alias="filterResult")
    #: The task-shape distribution FGD-family policies score against: "builtin"
    #: (`TargetWorkload.default`) or "observed": FGD's typical pods of the live pods the
    #: extender watches, rebuilt after `workload_refresh_pods` pods came or went.
    target_workload: Literal["builtin", "observed"] = Field(default="builtin",
                                                            validation_alias="targetWorkload")
    workload_refresh_pods: int = Field(default=200, validation_alias="workloadRefreshPods", ge=1,
                                       le=1_000_000)

    #: HTTP limits of one request (`wire.Limits`; docs/scheduler.md, "HTTP limits").
    max_request_bytes: int = Field(default=16 * 2**20, validation_alias="maxRequestBytes",
                                   ge=64 * 1024, le=2**30)
    max_nodes_per_request: int = Field(default=20_000, validation_alias="maxNodesPerRequest",
                                       ge=1, le=1_000_000)

    @field_validator("node_policy")
    @classmethod
    def _node(cls, value: str) -> str:
        return check_policy("node", value)

    @field_validator("card_policy")
    @classmethod
    def _card(cls, value: str | None) -> str | None:
        return None if value is None else check_policy("card", value)

    @property
    def effective_card_policy(self) -> str:
        """The card tier pods get unless their annotation names one: `cardPolicy`, else the one
        the node policy is paired with (what `egpu simulate --card-policy auto` measures)."""
        from elastic_gpu.core.policies import default_card_policy

        return self.card_policy or default_card_policy(self.node_policy)


def load_config(path: Path | None) -> SchedulerConfig:
    return load_settings(path, SchedulerConfig, ConfigError, "SchedulerConfig")
