"""The sandbox's own components: what `egpu sandbox up` runs beside Kubernetes.

Kubernetes itself (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) is the
`ControlPlane`'s. Everything else is one entry of `REGISTRY`: a name, how to start it (argv),
whether it serves on a loopback port and how to tell it is ready, and when in `up` it starts.
A new component (`egpu controller`, ...) joins the sandbox by adding
one entry; `up`, `status` and `down` then start, report and stop it like the others.

Order of `up` (sandbox.py): control plane up to kube-controller-manager -> components of
`Stage.BEFORE_SCHEDULER`, each ready (an extender must answer before kube-scheduler calls
it) -> kube-scheduler (calling every `extender` component) -> kwok -> nodes registered and
Ready -> each component's `knows_nodes` check -> components of `Stage.AFTER_NODES`.

Everything here is data and pure functions; starting and waiting is sandbox.py's.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_gpu.devcluster.ports import HOST


class Stage(enum.Enum):
    #: After the apiserver and controller manager, ready before kube-scheduler starts.
    BEFORE_SCHEDULER = "before-scheduler"
    #: Once the nodes are registered and Ready.
    AFTER_NODES = "after-nodes"


class Role(enum.Enum):
    #: Elastic GPU itself (extender, webhook, controller): `--bare` leaves these out.
    SYSTEM = "system"
    #: Stands in for what runs on the nodes (the fake nodes' allocation sync): always runs.
    NODE = "node"


@dataclass(frozen=True)
class ComponentEnv:
    """What a component's command line may refer to."""

    #: The admin kubeconfig of the sandbox's apiserver.
    kubeconfig: Path
    #: The sandbox's working directory (certificates, logs, ...): put files here.
    work_dir: Path
    #: The loopback port allocated to the component (0 when it serves none).
    port: int
    #: The Python interpreter `egpu` runs under.
    python: str
    #: The endpoints of the components started before it (name -> URL), e.g. the extender's.
    endpoints: Mapping[str, str] = field(default_factory=dict)
    #: Whether kube-scheduler ignores the quota's accounting names, so the webhook may add
    #: them (`scheduler.kubeconfig.ignores_quota_names`; a --scheduler-config may not).
    quota_names_ignored: bool = True
    #: The scheduler extender's config file (`egpu sandbox up --extender-config`, already
    #: validated by `scheduler.config.load_config`); None: its defaults.
    extender_config: Path | None = None


@dataclass(frozen=True)
class ComponentSpec:
    """One supervised process of the sandbox."""

    name: str
    role: Role
    stage: Stage
    #: Its command line.
    argv: Callable[[ComponentEnv], list[str]]
    #: The path of an HTTP GET on its port that answers 200 once it is ready; None: it
    #: serves nothing and is ready once started.
    ready_path: str | None = None
    #: kube-scheduler calls it as its extender (its URL becomes the config's urlPrefix).
    extender: bool = False
    #: (its `/metrics` text, the nodes) -> the nodes it does not know yet. After the nodes
    #: are Ready, `up` waits until that is empty (e.g. the extender's caches hold them all).
    knows_nodes: Callable[[str, Mapping[str, int]], list[str]] | None = None
    #: "https" for a component serving TLS (its self-signed certificate is not verified by
    #: the readiness check)
    scheme: str = "http"
    #: what `up` says of it, before its endpoint (None: nothing)
    title: str | None = None

    @property
    def serves(self) -> bool:
        return self.ready_path is not None


def endpoint(spec: ComponentSpec, port: int) -> str | None:
    """The URL a component serves on, None if it serves nothing."""
    return f"{spec.scheme}://{HOST}:{port}" if spec.serves else None


def select(registry: Iterable[ComponentSpec], *, bare: bool) -> list[ComponentSpec]:
    """The components `up` runs, in registry order: all of them, or with `bare` only those
    standing in for the nodes (Kubernetes alone, no Elastic GPU)."""
    chosen = [spec for spec in registry if not (bare and spec.role is Role.SYSTEM)]
    names = [spec.name for spec in chosen]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"component names must be unique: {duplicates} repeated")
    return chosen


def scheduler_config(user_config: Mapping[str, Any] | None,
                     extender_urls: Sequence[str]) -> dict[str, Any]:
    """kube-scheduler's configuration: the user's (`--scheduler-config`) as given, else the
    one deploy/scheduler/kube-scheduler-config.yaml is made from, pointed at the sandbox's
    extender; with no extender (`--bare`), kube-scheduler's defaults."""
    from elastic_gpu.scheduler.schedconfig import extender_stanza, kube_scheduler_config

    if user_config is not None:
        return dict(user_config)
    if not extender_urls:
        return {}
    config = kube_scheduler_config(extender_urls[0])
    config["extenders"] += [extender_stanza(url) for url in extender_urls[1:]]
    return config


_CARD_SAMPLE = re.compile(
    r'^elasticgpu_scheduler_card_compute_allocated_millicards\{(?=[^}]*device_index="(?P<card>[^"]*)")'
    r'(?=[^}]*node="(?P<node>[^"]*)")[^}]*\}', re.MULTILINE)


def cards_known(metrics_text: str) -> dict[str, int]:
    """Cards per node in the extender's caches, from its /metrics page."""
    known: dict[str, int] = {}
    for match in _CARD_SAMPLE.finditer(metrics_text):
        known[match["node"]] = known.get(match["node"], 0) + 1
    return known


def extender_missing_nodes(metrics_text: str, cards: Mapping[str, int]) -> list[str]:
    """The GPU nodes whose `cards` (as their agents publish them: a 2-chip board not split is
    one card) the extender does not all know yet (empty: it knows all)."""
    known = cards_known(metrics_text)
    return [name for name, count in cards.items() if count and known.get(name, 0) < count]


def _extender_argv(env: ComponentEnv) -> list[str]:
    config = [] if env.extender_config is None else ["--config", str(env.extender_config)]
    return [env.python, "-m", "elastic_gpu.cli.main", "scheduler",
            "--kubeconfig", str(env.kubeconfig), "--host", HOST, "--port", str(env.port),
            *config]


#: The sandbox's extender replicas' Lease holder identities: `SANDBOX_REPLICA_IDENTITY % i`,
#: the same for every start of replica i (as the chart's pod names).
SANDBOX_REPLICA_IDENTITY = "egpu-sandbox-scheduler-%d"
#: How many extender replicas `egpu sandbox up --extender-replicas` may run.
MAX_EXTENDER_REPLICAS = 5


def _replica_argv(index: int) -> Callable[[ComponentEnv], list[str]]:
    def argv(env: ComponentEnv) -> list[str]:
        return [*_extender_argv(env), "--leader-elect",
                "--identity", SANDBOX_REPLICA_IDENTITY % index]
    return argv


def _front_argv(replicas: Sequence[str]) -> Callable[[ComponentEnv], list[str]]:
    def argv(env: ComponentEnv) -> list[str]:
        backends = [a for name in replicas
                    for a in ("--backend", env.endpoints[name].split("://", 1)[1])]
        return [env.python, "-m", "elastic_gpu.devcluster.readyproxy", "--host", HOST,
                "--port", str(env.port), *backends]
    return argv


def with_extender_replicas(registry: Sequence[ComponentSpec], replicas: int
                           ) -> tuple[ComponentSpec, ...]:
    """`registry` with its extender run as `replicas` leader-elected replicas
    (`egpu-scheduler-0`, ...; ready when they answer /healthz: a standby never is on
    /readyz) behind `devcluster.readyproxy`, which takes the extender's name, port role and
    checks: kube-scheduler and the controller call it, and it sends each connection to the
    replica that leads (the stand-in for the chart's Service and kube-proxy)."""
    if not 1 <= replicas <= MAX_EXTENDER_REPLICAS:
        raise ValueError(f"extender replicas: {replicas} is not in 1-{MAX_EXTENDER_REPLICAS}")
    if replicas == 1:
        return tuple(registry)
    result: list[ComponentSpec] = []
    for spec in registry:
        if spec.name != EXTENDER.name:
            result.append(spec)
            continue
        names = [f"{EXTENDER.name}-{i}" for i in range(replicas)]
        result += [ComponentSpec(name=name, role=Role.SYSTEM, stage=Stage.BEFORE_SCHEDULER,
                                 argv=_replica_argv(i), ready_path="/healthz",
                                 title=f"extender replica {i} (leader-elected):")
                   for i, name in enumerate(names)]
        result.append(ComponentSpec(
            name=EXTENDER.name, role=Role.SYSTEM, stage=Stage.BEFORE_SCHEDULER,
            argv=_front_argv(names), ready_path="/readyz", extender=True,
            knows_nodes=extender_missing_nodes,
            title="Elastic GPU scheduler extender (the leading replica), called by "
                  "kube-scheduler:"))
    return tuple(result)


def _allocation_sync_argv(env: ComponentEnv) -> list[str]:
    return [env.python, "-m", "elastic_gpu.devcluster.allocation_sync",
            "--kubeconfig", str(env.kubeconfig), "--metrics-host", HOST,
            "--metrics-port", str(env.port)]


#: The scheduler extender (`egpu scheduler`), which kube-scheduler calls.
EXTENDER = ComponentSpec(
    name="egpu-scheduler", role=Role.SYSTEM, stage=Stage.BEFORE_SCHEDULER,
    argv=_extender_argv, ready_path="/readyz", extender=True,
    knows_nodes=extender_missing_nodes,
    title="Elastic GPU scheduler extender, called by kube-scheduler:")

def _webhook_argv(env: ComponentEnv) -> list[str]:
    # the budget keeper's finalizer (the controller runs beside it); the quota's canonical
    # resources, on as in the chart, where kube-scheduler ignores them (the sandbox's own
    # configuration does; a --scheduler-config that does not gets none, or every GPU pod
    # would find every node short): docs/budgets.md, "Quota"
    quota = ["--quota-resources"] if env.quota_names_ignored else []
    return [env.python, "-m", "elastic_gpu.cli.main", "webhook",
            "--kubeconfig", str(env.kubeconfig), "--host", HOST, "--port", str(env.port),
            "--budget-finalizer", *quota]


#: The admission webhook (`egpu webhook`): HTTPS on loopback, registered by itself (its own CA,
#: a `url` clientConfig at 127.0.0.1) once it has listed the Nodes; ready after that.
WEBHOOK = ComponentSpec(
    name="egpu-webhook", role=Role.SYSTEM, stage=Stage.BEFORE_SCHEDULER,
    argv=_webhook_argv, ready_path="/readyz", scheme="https",
    title="Elastic GPU admission webhook, called by kube-apiserver:")

#: The sandbox's one controller's Lease holder identity, the same for every start: a controller
#: restarted after a SIGKILL renews its own Lease at once instead of waiting for it to expire
#: (client-go renews a Lease whose holder is itself), as the chart's does with its pod's name.
CONTROLLER_IDENTITY = "egpu-sandbox-controller"


#: The sandbox's controller config, in its work dir, written by `up` when a node group opted in
#: to dynamic MIG (`migDynamic: true`): `mig.dynamic` on, with a test bed's short cool-down.
CONTROLLER_CONFIG = "controller-config.yaml"
MIG_DYNAMIC_CONFIG = """\
mig:
  dynamic:
    enabled: true
    mergeCooldownSeconds: 10
"""


def _controller_argv(env: ComponentEnv) -> list[str]:
    config = env.work_dir / CONTROLLER_CONFIG
    return [env.python, "-m", "elastic_gpu.cli.main", "controller",
            "--kubeconfig", str(env.kubeconfig), "--metrics-host", HOST,
            "--metrics-port", str(env.port),
            "--extender-url", env.endpoints.get(EXTENDER.name, f"http://{HOST}:8888"),
            "--identity", CONTROLLER_IDENTITY,
            *(["--config", str(config)] if config.is_file() else [])]


#: The controllers (`egpu controller`: claims binding and provisioning through the extender's
#: /provision, the MIG adapter), started after the extender; ready once it leads with its caches synced.
CONTROLLER = ComponentSpec(
    name="egpu-controller", role=Role.SYSTEM, stage=Stage.BEFORE_SCHEDULER,
    argv=_controller_argv, ready_path="/readyz",
    title="Elastic GPU controller (claims, MIG adapter, budgets), metrics and health at")

#: kwok nodes have no agent to keep their cards' allocation columns and observed usage current;
#: this stands in for it, and serves what their agents' `/metrics` would (ready once it does).
ALLOCATION_SYNC = ComponentSpec(
    name="allocation-sync", role=Role.NODE, stage=Stage.AFTER_NODES,
    argv=_allocation_sync_argv, ready_path="/metrics",
    title="kwok nodes' agent metrics (allocation-sync):")

#: Every component `egpu sandbox up` runs beside Kubernetes, in start order within a stage.
REGISTRY: tuple[ComponentSpec, ...] = (EXTENDER, WEBHOOK, CONTROLLER, ALLOCATION_SYNC)
