"""The KubeSchedulerConfiguration that puts the extender beside kube-scheduler.

Generated from the one resource table, so every GPU name users may write is a managed
resource kube-scheduler sends to us and does not count itself (`ignoredByScheduler`: the
extender owns GPU accounting per card; kube-scheduler keeps CPU, memory, affinity, taints...).
One name is the exception: `node.elasticgpu.io/gpu-core` (`core.nodefit`), the node-level GPU
count that nodes advertise and the webhook puts on every GPU pod, is managed with
`ignoredByScheduler: false`, so NodeResourcesFit sees a node short of GPU and DefaultPreemption
proposes victims (docs/budgets.md, "Preemption (must-show 2)").
deploy/scheduler/kube-scheduler-config.yaml is this function's output (a test checks it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import QUOTA_NAMES
from elastic_gpu.core.resources import RESOURCE_TABLE, MigProfile
from elastic_gpu.core.schedulers import PEER_SCHEDULERS

#: MIG profiles of the A30, A100 40/80 GB, H100/H200: managedResources takes exact names.
MIG_PROFILES = (
    "1g.6gb", "2g.12gb", "4g.24gb",
    "1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
)


def managed_resource_names() -> list[str]:
    """Every GPU name, the MIG profiles' names, and the quota's accounting names
    (`core.quota.QUOTA_NAMES`: no node advertises them, so kube-scheduler must ignore them or
    it would find every node short; docs/budgets.md, "Quota"): all `ignoredByScheduler`."""
    names = [spec.name for spec in RESOURCE_TABLE]
    names += [MigProfile.parse(p).resource_name for p in MIG_PROFILES]
    names += list(QUOTA_NAMES)
    return names


#: Managed resources kube-scheduler counts itself (`ignoredByScheduler: false`).
COUNTED_NAMES = (NODE_CORE,)


def managed_resources() -> list[dict[str, Any]]:
    """The extender's `managedResources`: the ignored GPU names, then the counted ones."""
    return ([{"name": n, "ignoredByScheduler": True} for n in managed_resource_names()]
            + [{"name": n, "ignoredByScheduler": False} for n in COUNTED_NAMES])


#: Where deploy/scheduler/kube-scheduler-config-tls.yaml expects kube-scheduler's client
#: certificate and the CA of the extender's serving certificate (docs/scheduler.md, "Security").
TLS_FILES = {"certFile": "/etc/elastic-gpu/tls/client.crt",
             "keyFile": "/etc/elastic-gpu/tls/client.key",
             "caFile": "/etc/elastic-gpu/tls/ca.crt"}


def extender_stanza(url_prefix: str, *, weight: int = 5, http_timeout: str = "5s",
                    enable_https: bool = False, prioritize: bool = True,
                    tls_config: dict[str, str] | None = None) -> dict[str, Any]:
    """`prioritize=False` goes with the extender's `filterResult: best`: its filter leaves one
    node, kube-scheduler then scores nothing, and a prioritize verb would never be called.
    `tls_config`: kube-scheduler's extender tlsConfig (certFile/keyFile/caFile or
    certData/keyData/caData): HTTPS, presenting a client certificate the extender verifies."""
    stanza: dict[str, Any] = {
        "urlPrefix": url_prefix,
        "filterVerb": "filter",
        "bindVerb": "bind",
        "preemptVerb": "preempt",
        "weight": weight,
        "enableHTTPS": enable_https,
        "nodeCacheCapable": True,
        "httpTimeout": http_timeout,
        "ignorable": False,
        "managedResources": managed_resources(),
    }
    if tls_config is not None:
        stanza["enableHTTPS"] = True
        stanza["tlsConfig"] = dict(tls_config)
    if prioritize:
        stanza["prioritizeVerb"] = "prioritize"
    else:
        del stanza["weight"]  # kube-scheduler only reads it for prioritize
    return stanza


#: kube-scheduler's backoff after a failed attempt: podInitialBackoffSeconds doubled per
#: consecutive failure, up to podMaxBackoffSeconds (its defaults: 1 s and 10 s). While the
#: extender fails over (the leader dead, its Lease not yet taken: ~3.5 s with the 3 / 2 /
#: 0.5 s lease this was measured with, ~2 s with today's 2 / 1.5 / 0.5 s), every attempt
#: of a GPU pod is an error: with the defaults, a pod created
#: at the kill is tried at 0, 1, 3 and 7 s, waiting out a 4 s backoff after the new leader
#: serves. An error's backoff cannot be cut short (kube-scheduler keeps erroring pods in a
#: queue of their own that no cluster event moves, and only pops it on its 1 s tick; a
#: wake-up patch is no help), so the bound is the configuration's: 1 s, the least it accepts
#: (0 < initial <= max), retries a pod within a second of the new leader serving. The cost,
#: a pod that fails again and again retried every second, is one cheap failed attempt each.
POD_INITIAL_BACKOFF_S = 1
POD_MAX_BACKOFF_S = 1


def kube_scheduler_config(url_prefix: str = "http://127.0.0.1:8888", *,
                          scheduler_name: str = "default-scheduler",
                          weight: int = 5, prioritize: bool = True,
                          tls_config: dict[str, str] | None = None,
                          pod_max_backoff_s: int = POD_MAX_BACKOFF_S,
                          peer_schedulers: Sequence[str] = PEER_SCHEDULERS) -> dict[str, Any]:
    """`pod_max_backoff_s`: 10 is kube-scheduler's default (the configuration shipped before
    issue 39; bench/sched_failover.py --max-backoff compares the two). `peer_schedulers`: a
    profile of each name besides `scheduler_name`, so pods written for HAMi, KAI or Volcano
    are scheduled by this kube-scheduler and the extender (extenders apply to every profile)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "podInitialBackoffSeconds": POD_INITIAL_BACKOFF_S,
        "podMaxBackoffSeconds": pod_max_backoff_s,
        "profiles": [{"schedulerName": name}
                     for name in dict.fromkeys((scheduler_name, *peer_schedulers))],
        "extenders": [extender_stanza(url_prefix, weight=weight, prioritize=prioritize,
                                      tls_config=tls_config)],
    }


def ignores_quota_names(config: Mapping[str, Any]) -> bool:
    """Whether a KubeSchedulerConfiguration makes kube-scheduler ignore the quota's accounting
    names (`core.quota.QUOTA_NAMES`), which no node advertises: each is an extender's managed
    resource with `ignoredByScheduler`, or NodeResourcesFit's `ignoredResources` /
    `ignoredResourceGroups` name it in every profile. Where it does not, a pod carrying them
    would find every node short, so the sandbox leaves the quota mutator off."""
    ignored_everywhere: set[str] = set()
    for extender in config.get("extenders") or []:
        for managed in (extender or {}).get("managedResources") or []:
            if isinstance(managed, Mapping) and managed.get("ignoredByScheduler") is True:
                ignored_everywhere.add(str(managed.get("name")))
    profiles = config.get("profiles") or [{}]
    for name in QUOTA_NAMES:
        if name in ignored_everywhere:
            continue
        group = name.split("/", 1)[0]
        for profile in profiles:
            fit = [c.get("args") or {} for c in (profile or {}).get("pluginConfig") or []
                   if isinstance(c, Mapping) and c.get("name") == "NodeResourcesFit"]
            if not any(name in (args.get("ignoredResources") or [])
                       or group in (args.get("ignoredResourceGroups") or []) for args in fit):
                return False
    return True
