"""kwok configuration: which nodes it manages and the stages that move fake nodes and pods.

kwok alone does nothing until it is given stages (kwokctl writes them for its clusters; we
run the bare binary). Ours are the minimum for a scheduling test bed: a fake node becomes
Ready keeping the capacity it was registered with, stays Ready (leases plus a slow
heartbeat), a pod bound to it becomes Running, and a pod being deleted goes away (there is
no kubelet to finish the deletion).

A Running pod's statuses are what kubelet reports once its containers started: every
container running, and its init containers in `initContainerStatuses` (KEP-753): a sidecar
(`restartPolicy: Always`) running beside the containers since the pod started, a classic one
terminated, Completed. The budget keeper bills a sidecar's GPU share from that status
(`core.budget.ledger.container_runs`), as it does on a real node.
"""

from __future__ import annotations

from typing import Any

import yaml

#: Nodes carrying this annotation are kwok's; the agent's real nodes never are.
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_ANNOTATION_VALUE = "fake"

_NODE_CONDITIONS = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

# Capacity and allocatable are what the node was registered with (its GPUs): never replaced.
_NODE_INITIALIZE = _NODE_CONDITIONS + """\
addresses:
{{ with .status.addresses }}
{{ YAML . 1 }}
{{ else }}
- address: {{ NodeIP | Quote }}
  type: InternalIP
- address: {{ .metadata.name | Quote }}
  type: Hostname
{{ end }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
  bootID: ""
  machineID: ""
  osImage: ""
  systemUUID: ""
phase: Running
"""

_POD_RUNNING = """\
{{ $now := Now }}
conditions:
- {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with .spec.initContainers }}
initContainerStatuses:
{{ range . }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  restartCount: 0
  ready: true
{{ if eq ( or .restartPolicy "" ) "Always" }}
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  started: false
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
hostIPs:
- ip: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
podIPs:
- ip: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _stage(name: str, kind: str, expressions: list[dict[str, Any]], next_: dict[str, Any],
           delay: dict[str, int] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": expressions},
        "next": next_,
    }
    if delay:
        spec["delay"] = delay
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
            "spec": spec}


_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'


def stages() -> list[dict[str, Any]]:
    return [
        _stage("node-initialize", "Node",
               [{"key": _READY, "operator": "NotIn", "values": ["True"]}],
               {"statusTemplate": _NODE_INITIALIZE}),
        # Leases keep nodes alive for the node lifecycle controller; this refreshes the
        # condition timestamps now and then for anyone who reads them.
        _stage("node-heartbeat", "Node",
               [{"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": _READY, "operator": "In", "values": ["True"]}],
               {"statusTemplate": _NODE_CONDITIONS},
               delay={"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000}),
        _stage("pod-running", "Pod",
               [{"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]}],
               {"statusTemplate": _POD_RUNNING}),
        _stage("pod-delete", "Pod",
               [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
               {"delete": True}),
    ]


def kwok_config_yaml() -> str:
    """The file passed to `kwok --config`: options plus stages, as one YAML stream."""
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector":
                f"{FAKE_NODE_ANNOTATION}={FAKE_NODE_ANNOTATION_VALUE}",
            "nodeLeaseDurationSeconds": 40,
            "cidr": "10.244.0.0/16",
            "nodeIP": "10.0.0.1",
            # Bulk registration of hundreds of nodes: more workers than the default 4.
            "nodePlayStageParallelism": 16,
            "podPlayStageParallelism": 16,
            "nodeLeaseParallelism": 16,
        },
    }
    return yaml.safe_dump_all([options, *stages()], sort_keys=False)
