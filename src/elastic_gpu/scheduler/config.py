"""The extender's own configuration file (YAML), validated strictly.

    nodePolicy: fgdx-auto        # node tier, any name in core's NODE_POLICIES; default: core's
                                 # DEFAULT_NODE_POLICY, as `egpu simulate --policy`
    cardPolicy: fgd-waste        # card tier, any name in core's CARD_POLICIES; default: the one
                                 # the node policy is paired with, as in `egpu simulate`
    reservationTTLSeconds: 30    # how long a bind whose outcome is unknown holds its cards
    seed: 0                      # random policies' seed, for reproducible runs
    filterResult: auto           # auto: the engine's one node, unless the pod states a soft preference
                                 # (then all); all: every fitting node (+ prioritize); best: only
                                 # the engine's choice, always (docs/scheduler.md, "One round trip")
    targetWorkload: builtin      # FGD's target workload: builtin, or observed (the live pods' shapes)
    workloadRefreshPods: 200     # observed: rebuild after this many pods came or went
    maxRequestBytes: 16777216    # larger request bodies get 413 (docs/scheduler.md, "HTTP limits")
    maxNodesPerRequest: 20000    # more candidate nodes in one request get 400
    schedulerNames: [default-scheduler, hami-scheduler, kai-scheduler, volcano]
                                 # the profiles whose kube-scheduler calls this extender (the
                                 # peers' too): /bind refuses pods of any other schedulerName
    headerTimeoutSeconds: 32     # a connection's TLS handshake and first request headers
    bodyTimeoutSeconds: 60       # a request's whole body within this of its headers, or 408
    idleTimeoutSeconds: 90       # a connection with no request in progress is closed after this
    maxConnections: 1024         # open at once; the oldest idle ones make room for new ones
    leaderElection:              # several replicas, one serving (docs/scheduler.md, "High availability")
      enabled: false             # true: only the holder of the Lease answers; the others stand by
      leaseNamespace: kube-system
      leaseName: egpu-scheduler
      leaseDurationSeconds: 2    # a dead leader's Lease is taken over this long after its last renewal
      renewDeadlineSeconds: 1.5  # a leader that could not renew for this long stops serving and exits
      retryPeriodSeconds: 0.5    # between renewals (leader) and acquire attempts (standbys)
    loadAware: false             # among equally good nodes and cards prefer lower observed
                                 # utilisation (GPUDevice status.usage): shares move off hot cards
    draAllocation: true          # place ResourceClaims of our DeviceClasses with our engine
                                 # (gated pods; docs/dra.md, "Claims placed by our engine")
    host: 127.0.0.1              # address to listen on (another one needs tls.clientCAFile)
    port: 8888
    healthPort: 0                # also /healthz and /readyz over plain HTTP here (0: none)
    drainSeconds: 10             # on SIGTERM, how long binds in progress may take to finish
    tls:                         # HTTPS (kube-scheduler's enableHTTPS); files read at start
      certFile: null
      keyFile: null              # with certFile
      clientCAFile: null         # clients must show a certificate this CA signed; needs certFile

Every key that a flag of `egpu scheduler` also sets (`FLAG_KEYS` in `cli/scheduler.py`) takes
the flag's value when the flag is given (`api.config.merge`): a flag beats the file, the file
beats the default.

Pods override both tiers with the elasticgpu.io/node-policy and elasticgpu.io/card-policy
annotations. Without `cardPolicy` (and without the pod's card-policy annotation) a pod's cards
are chosen by the card tier its node policy is paired with (`core.policies.default_card_policy`,
the same rule `egpu simulate --card-policy auto` uses): the cluster gets the quality the
simulator measured.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from elastic_gpu.api.config.connections import ConnectionLimitSettings
from elastic_gpu.api.config.leaderelection import LeaderElectionSettings
from elastic_gpu.api.config.loader import load_settings
from elastic_gpu.api.config.merge import Override
from elastic_gpu.core.names import NameRule, check_name
from elastic_gpu.core.policies import DEFAULT_NODE_POLICY
from elastic_gpu.core.schedulers import DEFAULT_SCHEDULER, PEER_SCHEDULERS


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


class LeaderElectionConfig(LeaderElectionSettings):
    """The extender's leader election (`leaderElection:`; keys and rules shared with the
    controllers', `api.config.leaderelection`). The defaults make a failover after
    a SIGKILL (no release) take about leaseDuration after the leader's last renewal (~2 s):
    the standby watches the Lease, waits the lease duration on its own clock, and tries the
    moment it expires (`kube.leaderelection.next_attempt_s`). They cost the API server one
    PUT of the Lease per retry period from the leader (2 requests/s) and a GET and a watch
    from each standby: a few Lease writes per second, against client-go's 15/10/2 s defaults
    (a failover of up to ~17 s) that the scheduler cannot afford: no GPU pod is scheduled
    while no replica serves (issue 39's goal: every pod created in a failover bound within 5
    s of the kill; at 3 s the p99 was at that edge, docs/benchmarks.md). The renew deadline,
    counted from when the last successful renewal was sent and checked on every verb
    (`LeaderElector.leads_now`), ends the leader's serving half a second before any standby
    may take over; the price of 2 s against 3 s: a leader whose renewals all fail for 1.5 s
    (the API server or its own process stalled that long) hands over, where 2 s was needed."""

    #: off: one replica, always serving (`--leader-elect` turns it on)
    enabled: bool = False
    lease_name: str = Field(default="egpu-scheduler", validation_alias="leaseName")
    lease_duration_s: float = Field(default=2.0, validation_alias="leaseDurationSeconds",
                                    ge=1, le=3600)
    renew_deadline_s: float = Field(default=1.5, validation_alias="renewDeadlineSeconds",
                                    gt=0, le=3600)
    retry_period_s: float = Field(default=0.5, validation_alias="retryPeriodSeconds",
                                  ge=0.05, le=600)


class TLSConfig(BaseModel):
    """The extender's HTTPS (`tls:`): its certificate and key, and the CA whose certificates
    clients must show (mutual TLS: /bind writes Bindings). Files are read at start."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)

    cert_file: str | None = Field(default=None, validation_alias="certFile")
    key_file: str | None = Field(default=None, validation_alias="keyFile")
    client_ca_file: str | None = Field(default=None, validation_alias="clientCAFile")

    @model_validator(mode="after")
    def _pairs(self) -> TLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("certFile and keyFile go together")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("clientCAFile needs certFile and keyFile (HTTPS)")
        return self


class SchedulerConfig(ConnectionLimitSettings):
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
    #: scoring and the prioritize round trip (docs/scheduler.md, "One round trip per pod");
    #: "auto" (the default): "best" for a pod that states no soft preference and meets no
    #: PreferNoSchedule taint it does not tolerate, "all" for the others (`narrowing`).
    filter_result: Literal["auto", "all", "best"] = Field(default="auto",
                                                          validation_alias="filterResult")
    #: The task-shape distribution FGD-family policies score against: "builtin"
    #: (`TargetWorkload.default`) or "observed": FGD's typical pods of the live pods the
    #: extender watches, rebuilt after `workload_refresh_pods` pods came or went.
    target_workload: Literal["builtin", "observed"] = Field(default="builtin",
                                                            validation_alias="targetWorkload")
    workload_refresh_pods: int = Field(default=200, validation_alias="workloadRefreshPods", ge=1,
                                       le=1_000_000)
    #: The load-aware option (`PolicyConfig.load_aware`; docs/scheduler.md, "Load-aware
    #: placement"): ties between nodes and between cards go to lower observed utilisation.
    load_aware: bool = Field(default=False, validation_alias="loadAware")
    #: The DRA allocator (`scheduler.dra_allocator`; docs/dra.md, "Claims placed by our
    #: engine"): pods gated by the webhook for claims of our DeviceClasses are placed by the
    #: engine, their claims' allocations written, then the gate lifted. Off: it never runs
    #: and gated pods wait (turn the webhook's gate off with it).
    dra_allocation: bool = Field(default=True, validation_alias="draAllocation")

    #: HTTP limits of one request (`wire.Limits`; docs/scheduler.md, "HTTP limits").
    max_request_bytes: int = Field(default=16 * 2**20, validation_alias="maxRequestBytes",
                                   ge=64 * 1024, le=2**30)
    max_nodes_per_request: int = Field(default=20_000, validation_alias="maxNodesPerRequest",
                                       ge=1, le=1_000_000)
    #: The schedulerNames of the KubeSchedulerConfiguration profiles whose kube-scheduler
    #: calls this extender (`core.schedulers`): a /bind of another scheduler's pod is refused.
    #: (not strict: a YAML list becomes the tuple; each entry must still be a string)
    scheduler_names: tuple[str, ...] = Field(default=(DEFAULT_SCHEDULER, *PEER_SCHEDULERS),
                                             min_length=1,
                                             max_length=64, validation_alias="schedulerNames",
                                             strict=False)

    #: Several replicas, one serving (docs/scheduler.md, "High availability").
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig,
                                                  validation_alias="leaderElection")

    #: Where the extender serves (docs/scheduler.md, "Security"): loopback by default, as it
    #: runs beside kube-scheduler.
    host: str = Field(default="127.0.0.1", min_length=1, max_length=253)
    port: int = Field(default=8888, ge=1, le=65535)
    #: a plain-HTTP listener with only /healthz and /readyz, for kubelet's probes when the
    #: main port requires client certificates (0: none)
    health_port: int = Field(default=0, validation_alias="healthPort", ge=0, le=65535)
    #: on SIGTERM, how long binds in progress may take to finish
    drain_s: float = Field(default=10.0, validation_alias="drainSeconds", ge=0, le=300)
    tls: TLSConfig = Field(default_factory=TLSConfig)

    @model_validator(mode="after")
    def _exposed_only_with_client_certificates(self) -> SchedulerConfig:
        # /bind writes Bindings with the extender's rights: off loopback, only for a client
        # with a certificate (the help and docs said so; a plain 0.0.0.0 was served)
        if not is_loopback(self.host) and self.tls.client_ca_file is None:
            raise ValueError(f"host {self.host!r} is not loopback: /bind writes Bindings, so "
                             "another address needs tls.clientCAFile (mutual TLS; "
                             "docs/scheduler.md, \"Security\")")
        return self

    @field_validator("scheduler_names")
    @classmethod
    def _schedulers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            check_name(name, NameRule.SUBDOMAIN, "schedulerNames entry")
        return value

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


def is_loopback(host: str) -> bool:
    """Whether the extender listening on `host` is reachable from this host only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_config(path: Path | None, flags: Iterable[Override] = ()) -> SchedulerConfig:
    """The SchedulerConfig in `path` (every default without one) with the flags given on top
    (`cli/scheduler.py`'s `FLAG_KEYS`; `api.config.merge`); `ConfigError`
    (`api.config.loader`) naming the file, then each field, value and rule."""
    return load_settings(path, SchedulerConfig, "SchedulerConfig", overrides=flags)
