"""`egpu controller --config FILE`: every setting of the controllers (YAML, kind
ControllerConfig), validated strictly. Each flag of `egpu controller` sets one key
(`cli/controller.py`, `FLAG_KEYS`): a flag given beats the file, the file beats the default
below (`api.config.merge`, the same rule for every component; docs/config.md).

    apiVersion: elasticgpu.io/v1alpha1  # optional header
    kind: ControllerConfig
    controllers: []               # run only these (claims, mig, budgets, defrag, mig-dynamic); []: all
    workers: 16                   # concurrent reconciles per controller (--workers)
    backoff:                      # a failed key's retries: base, doubling up to max
      baseSeconds: 0.005          #   (--backoff-base)
      maxSeconds: 10              #   (--backoff-max)
    leaderElection:               # always on; keys and rules as the extender's
      leaseNamespace: kube-system #   (--lease-namespace, or POD_NAMESPACE)
      leaseName: egpu-controller  #   (--lease-name)
      leaseDurationSeconds: 15    #   (--lease-duration)
      renewDeadlineSeconds: 10    #   (--renew-deadline)
      retryPeriodSeconds: 2       #   (--retry-period)
    metrics:                      # /metrics, /healthz, /readyz
      host: 127.0.0.1             #   (--metrics-host)
      port: 8080                  #   (--metrics-port)
    extender:                     # the extender whose POST /provision places Immediate claims
      url: http://127.0.0.1:8888  #   (--extender-url)
      caFile: null                #   its HTTPS certificate's CA (--extender-ca)
      clientCertFile: null        #   the client certificate shown to it (--extender-client-cert)
      clientKeyFile: null         #   and its key (--extender-client-key)
    budgets:                      # the budget keeper (docs/budgets.md)
      defaultGPUHours: null       #   the cluster default budget; null: none (--budget-default-gpu-hours)
      defaultPeriod: 168h         #   its period, at least 1m (--budget-default-period)
      refreshSeconds: 30          #   status.used rewritten at most this often (--budget-refresh-seconds)
      minWriteSeconds: 1          #   one status write per namespace at most this often
                                  #   (--budget-min-write-seconds)
    mig:                          # the MIG adapter (docs/mig-adapter.md)
      enabled: true               # false: the adapter moves nothing (and moves nothing back)
      namespaces: [team-a]        # only pods of these namespaces move (default: every one)
      excludeNamespaces: [batch]  # never pods of these (wins over `namespaces`)
      substitutions:              # which profiles may stand in for which (default: the
        1g.10gb: [2g.20gb]        #   compatibility rule alone, core.mig.profiles.compatible); a
                                  #   profile not listed here is never substituted
      moveBack: always            # never | when-idle | always (default always)
      ruleGraceSeconds: 30        # an owner's rule no pod refers to yet is kept this long
      recarveAdvice: false        # true: a NoCompatibleProfileFree Event also says which
                                  #   re-carve of a card would fit (dry run; never done)
      dynamic:                    # dynamic MIG: carve and merge back cards (docs/mig-apply.md)
        enabled: false            #   off by default; only nodes labelled
                                  #   elasticgpu.io/mig-dynamic=true are ever changed
        mergeCooldownSeconds: 300 #   a carved card is merged back this long after its last
                                  #   change or release, at the earliest
        maxCardsPerRound: 0       #   cards changed per round at most (0: no bound)
    defrag:                       # the defragmentation controller (docs/defrag.md)
      enabled: false              # off by default
      namespaces: [team-a]        # pending pods of these namespaces are made room for
                                  #   (default: every namespace)
      mode: report                # report: an Event with the plan, nothing moves | move
      movableNamespaces: [batch]  # every pod (with a re-creating owner) of these may move;
                                  #   elsewhere only pods labelled elasticgpu.io/movable=true
      maxMoves: 2                 # moves per pending pod (the planner's budget)
      coolDownSeconds: 600        # an owner moved (or a PDB refusal) is left alone this long
      maxMovesPerNode: 2          # evictions from one node per rateWindowSeconds
      maxMovesCluster: 10         # evictions in all per rateWindowSeconds
      rateWindowSeconds: 600
      settleSeconds: 120          # after a plan is carried out, no new plan until its pending
                                  #   pod is bound or this long has passed
      policy: null                # the node policy the planner scores with (default: its own)

Without `--config`, every default (and the flags given). A bad file or flag stops the
controller at start with the file, the field (a flag's by its name), the value and the rule
(exit code 2), as the scheduler's `--config` does.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from elastic_gpu.api.budget import BudgetObjectError, parse_duration
from elastic_gpu.api.config.leaderelection import LeaderElectionSettings
from elastic_gpu.api.config.loader import load_settings
from elastic_gpu.api.config.merge import Override
from elastic_gpu.core.budget.allowance import MIN_PERIOD_S
from elastic_gpu.core.mig.profiles import MIG_MODELS, compatible
from elastic_gpu.core.mig.substitution import MoveBackPolicy
from elastic_gpu.core.resources import MigProfile, ResourceError


def _profile(name: str, where: str) -> MigProfile:
    try:
        profile = MigProfile.parse(name)
    except ResourceError as err:
        raise ValueError(f"{where} {name!r} is not a MIG profile ({err.rule})") from None

    if not any(m.size(profile) is not None for m in MIG_MODELS):
        raise ValueError(f"{where} {name!r} is no profile of a MIG-capable model (see "
                         "docs/mig-adapter.md for the table)")
    return profile


def _namespaces(value: Any) -> Any:
    if value is None:
        return value
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError("must be a list of namespace names")
    return frozenset(value)


class MigDynamicConfig(BaseModel):
    """`mig.dynamic`: the mig-dynamic controller (`controller/mig/dynamic.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    enabled: bool = False
    merge_cooldown_s: float = Field(default=300.0, validation_alias="mergeCooldownSeconds",
                                    ge=0, le=86400)
    max_cards_per_round: int = Field(default=0, validation_alias="maxCardsPerRound", ge=0,
                                     le=10000)


class MigConfig(BaseModel):
    # strict: `enabled: "no"` is refused, not read as false; a number is a YAML number.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    enabled: bool = True
    #: None: every namespace
    namespaces: frozenset[str] | None = None
    exclude_namespaces: frozenset[str] = Field(default=frozenset(),
                                               validation_alias="excludeNamespaces")
    #: from profile -> the profiles that may stand in for it; None: the compatibility rule
    substitutions: Mapping[str, frozenset[str]] | None = None
    move_back: MoveBackPolicy = Field(default=MoveBackPolicy.ALWAYS, validation_alias="moveBack",
                                      strict=False)
    rule_grace_s: float = Field(default=30.0, validation_alias="ruleGraceSeconds", ge=0,
                                le=3600)
    #: the dry-run re-carve advisor (`core.mig.recarve.recarve_advice`): Event text only
    recarve_advice: bool = Field(default=False, validation_alias="recarveAdvice")
    #: dynamic MIG (issue 42): off unless `enabled`
    dynamic: MigDynamicConfig = MigDynamicConfig()

    @field_validator("move_back", mode="before")
    @classmethod
    def _move_back(cls, value: Any) -> Any:
        # the enum from its YAML string (strict mode would want the enum object itself)
        if not isinstance(value, str | MoveBackPolicy):
            raise ValueError("must be a string: never, when-idle or always")
        return value

    @field_validator("substitutions", mode="before")
    @classmethod
    def _substitutions(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping of profile: [profiles that may replace it]")
        out: dict[str, frozenset[str]] = {}
        for source, targets in value.items():
            src = _profile(str(source), "key")
            if not isinstance(targets, list) or not targets:
                raise ValueError(f"{source}: must be a non-empty list of profiles")
            names = set()
            for target in targets:
                dst = _profile(str(target), f"{source}:")
                if dst == src:
                    raise ValueError(f"{source}: {target} is the profile itself")
                if not any(compatible(src, dst, m.name) for m in MIG_MODELS):
                    raise ValueError(
                        f"{source}: {target} may not stand in for it on any model: a substitute "
                        "is in the same GPU family with at least the compute slices and memory "
                        "asked (and +me for +me)")
                names.add(dst.name)
            out[src.name] = frozenset(names)
        return out

    @field_validator("namespaces", "exclude_namespaces", mode="before")
    @classmethod
    def _namespace_list(cls, value: Any) -> Any:
        return _namespaces(value)

    def governs(self, namespace: str) -> bool:
        """Whether pods of `namespace` may be moved."""
        if not self.enabled or namespace in self.exclude_namespaces:
            return False
        return self.namespaces is None or namespace in self.namespaces


class DefragMode(enum.Enum):
    REPORT = "report"
    MOVE = "move"


class DefragConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    enabled: bool = False
    #: None: pending pods of every namespace are made room for
    namespaces: frozenset[str] | None = None
    mode: DefragMode = Field(default=DefragMode.REPORT, strict=False)
    movable_namespaces: frozenset[str] = Field(default=frozenset(),
                                               validation_alias="movableNamespaces")
    max_moves: int = Field(default=2, validation_alias="maxMoves", ge=1, le=16)
    cool_down_s: float = Field(default=600.0, validation_alias="coolDownSeconds", ge=0,
                               le=7 * 86400)
    max_moves_per_node: int = Field(default=2, validation_alias="maxMovesPerNode", ge=1,
                                    le=1000)
    max_moves_cluster: int = Field(default=10, validation_alias="maxMovesCluster", ge=1,
                                   le=100000)
    rate_window_s: float = Field(default=600.0, validation_alias="rateWindowSeconds", gt=0,
                                 le=7 * 86400)
    settle_s: float = Field(default=120.0, validation_alias="settleSeconds", gt=0, le=3600)
    #: how long the cards a plan frees stay reserved for its pending pod (the
    #: `elasticgpu.io/defrag-reservation` annotation's expiry; `core.defrag.reservation`)
    reservation_s: float = Field(default=120.0, validation_alias="reservationSeconds", gt=0,
                                 le=900)
    policy: str | None = None

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        if not isinstance(value, str | DefragMode):
            raise ValueError("must be a string: report or move")
        return value

    @field_validator("namespaces", "movable_namespaces", mode="before")
    @classmethod
    def _namespace_list(cls, value: Any) -> Any:
        return _namespaces(value)

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from elastic_gpu.core.policies import node_policy

        try:
            node_policy(value)
        except (KeyError, ValueError) as err:
            raise ValueError(f"{value!r} is no node policy ({err})") from None
        return value

    def governs(self, namespace: str) -> bool:
        """Whether pending pods of `namespace` are made room for."""
        return self.enabled and (self.namespaces is None or namespace in self.namespaces)


class ControllerLeaderElection(LeaderElectionSettings):
    """The controllers' Lease (`leaderElection:`; keys and rules shared with the extender's,
    `api.config.leaderelection`): client-go's 15/10/2 s, as a controller's failover may take
    that long (claims wait; nothing is scheduled by it). The controller always elects."""

    lease_name: str = Field(default="egpu-controller", validation_alias="leaseName")


class BudgetsConfig(BaseModel):
    """The budget keeper's settings (`budgets:`, docs/budgets.md). `default_gpu_hours` and
    `default_period`: the cluster default, a GPUBudget named `DEFAULT_BUDGET_NAME` the keeper
    creates in every namespace that runs GPU pods and has none (None: namespaces without a
    GPUBudget have no budget). `refresh_s`: status.used is rewritten at most this often while
    it moves; `min_write_s`: at most one status write per namespace this often (settling and
    the over-budget flip included)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    default_gpu_hours: float | None = Field(default=None, validation_alias="defaultGPUHours",
                                            ge=0, le=1e9)
    default_period: str = Field(default="168h", validation_alias="defaultPeriod")
    refresh_s: int = Field(default=30, validation_alias="refreshSeconds", ge=1, le=86400)
    min_write_s: float = Field(default=1.0, validation_alias="minWriteSeconds", ge=0,
                               le=3600)

    @field_validator("default_period")
    @classmethod
    def _period(cls, value: str) -> str:
        try:
            parse_duration(value, "defaultPeriod", MIN_PERIOD_S)
        except BudgetObjectError as err:
            raise ValueError(str(err)) from None
        return value

    @property
    def default_name(self) -> str:
        return DEFAULT_BUDGET_NAME


#: The name of the GPUBudget the keeper creates for the cluster default.
DEFAULT_BUDGET_NAME = "default"


class ExtenderConfig(BaseModel):
    """The extender (`egpu scheduler`) whose POST /provision chooses the cards of Immediate
    claims (`extender:`): its URL, the CA its certificate is checked with, and the client
    certificate shown to it (its --tls-client-ca). Files are read at start."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)

    url: str = "http://127.0.0.1:8888"
    ca_file: str | None = Field(default=None, validation_alias="caFile")
    client_cert_file: str | None = Field(default=None, validation_alias="clientCertFile")
    client_key_file: str | None = Field(default=None, validation_alias="clientKeyFile")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _pair(self) -> ExtenderConfig:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("clientCertFile and clientKeyFile go together")
        return self


class BackoffConfig(BaseModel):
    """A failed key's retry delays (`backoff:`): `baseSeconds` first, doubling up to
    `maxSeconds`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True,
                              allow_inf_nan=False)

    base_s: float = Field(default=0.005, validation_alias="baseSeconds", ge=0.001, le=3600)
    max_s: float = Field(default=10.0, validation_alias="maxSeconds", ge=0.001, le=86400)

    @model_validator(mode="after")
    def _order(self) -> BackoffConfig:
        if self.max_s < self.base_s:
            raise ValueError(f"maxSeconds ({self.max_s:g}) must be >= baseSeconds "
                             f"({self.base_s:g})")
        return self


class MetricsConfig(BaseModel):
    """Where /metrics, /healthz and /readyz are served (`metrics:`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)


#: the controllers `egpu controller` can run: `controller.registry.CONTROLLERS`' names (a unit
#: test keeps the two equal; the registry imports every controller, this module none)
CONTROLLER_NAMES: tuple[str, ...] = ("claims", "mig", "budgets", "defrag", "mig-dynamic")


class ControllerConfig(BaseModel):
    """Every setting of `egpu controller` but the process's own (kubeconfig, identity, log
    level): the file's, with the flags given on top (`cli/controller.py`, `FLAGS`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)

    #: the controllers run (`controller.registry`); empty: every one
    controllers: tuple[str, ...] = Field(default=(), max_length=64, strict=False)
    #: concurrent reconciles per controller
    workers: int = Field(default=16, ge=1, le=256)
    backoff: BackoffConfig = BackoffConfig()
    leader_election: ControllerLeaderElection = Field(
        default_factory=ControllerLeaderElection, validation_alias="leaderElection")
    metrics: MetricsConfig = MetricsConfig()
    extender: ExtenderConfig = ExtenderConfig()
    budgets: BudgetsConfig = BudgetsConfig()
    mig: MigConfig = MigConfig()
    defrag: DefragConfig = DefragConfig()

    @field_validator("controllers")
    @classmethod
    def _known_controllers(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        # refused by `--check` as by a start (which exited 2 while --check said valid)
        unknown = sorted(set(names) - set(CONTROLLER_NAMES))
        if unknown:
            raise ValueError(f"unknown {unknown}; known controllers are {sorted(CONTROLLER_NAMES)}")
        return names


def load_config(path: Path | None, flags: Iterable[Override] = ()) -> ControllerConfig:
    """The ControllerConfig in `path` (every default without one) with the flags given on top
    (`cli/controller.py`, `FLAG_KEYS`); `ConfigError` (`api.config.loader`) naming the file,
    then each field (a flag's by its name), value and rule."""
    return load_settings(path, ControllerConfig, "ControllerConfig", overrides=flags)
