"""The defragmentation controller's sandbox tests' helpers: kubectl against the sandbox, the
workloads (Deployments first pinned to a node by a label only it has, bare pods), and `egpu
controller --only defrag` as a subprocess with its own Lease and config."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from egpu_testing.controller import ControllerProcess
from egpu_testing.dra_ledger import dra_inventories, over_capacity
from egpu_testing.sandbox import kubectl, kubectl_run
from egpu_testing.waiting import wait_for
from elastic_gpu.api import gpudevice
from elastic_gpu.core.annotations import MOVABLE_LABEL
from elastic_gpu.devcluster.ports import free_ports

NS = "defrag"
#: generous for a loaded box: no test asserts a duration
DEADLINE_S = 180.0
CONFIG = """\
defrag:
  enabled: true
  mode: {mode}
  maxMoves: 2
  coolDownSeconds: 3600
  settleSeconds: 60
"""


def get(kubeconfig: Path, *what: str) -> Any:
    result = kubectl_run(kubeconfig, "get", *what, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def apply(kubeconfig: Path, obj: dict[str, Any]) -> None:
    kubectl(kubeconfig, "apply", "-n", NS, "-f", "-", input=json.dumps(obj))


def pods(kubeconfig: Path) -> list[dict[str, Any]]:
    return list((get(kubeconfig, "pods", "-n", NS) or {}).get("items", []))


def running(kubeconfig: Path, app: str) -> list[dict[str, Any]]:
    return [p for p in pods(kubeconfig) if p["metadata"].get("labels", {}).get("app") == app
            and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") == "Running"]


def events(kubeconfig: Path, reason: str) -> list[dict[str, Any]]:
    items = (get(kubeconfig, "events", "-n", NS) or {}).get("items", [])
    return [e for e in items if e.get("reason") == reason]


def pod_spec(percent: int | None, selector: dict[str, str], cards: int = 1,
             limits: dict[str, str] | None = None) -> dict[str, Any]:
    """`percent` of a card, or `cards` whole cards, or (`limits`) what those limits ask."""
    if limits is None:
        limits = ({"nano-gpu/gpu-percent": str(percent)} if percent
                  else {"nvidia.com/gpu": str(cards)})
    return {"nodeSelector": selector, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "cuda:fake",
                            "resources": {"limits": limits}}]}


def deployment(name: str, percent: int | None, labels: dict[str, str] | None = None,
               limits: dict[str, str] | None = None) -> dict[str, Any]:
    """One replica of `percent` of a card (or of what `limits` ask), movable, placed where
    the label `defrag-home-<name>=yes` is (`open_homes` then lets its replacements go
    anywhere)."""
    all_labels = {"app": name, MOVABLE_LABEL: "true", **(labels or {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": all_labels},
                                  "spec": pod_spec(percent, {f"defrag-home-{name}": "yes"},
                                                   limits=limits)}}}


def bare(name: str, percent: int | None, node: str | None, cards: int = 1,
         limits: dict[str, str] | None = None) -> dict[str, Any]:
    """A bare pod (labelled movable: it never moves all the same)."""
    selector = {"kubernetes.io/hostname": node} if node else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name, MOVABLE_LABEL: "true"}},
            "spec": pod_spec(percent, selector, cards, limits)}


def make_namespace(kubeconfig: Path) -> None:
    kubectl(kubeconfig, "create", "namespace", NS)
    wait_for("the default ServiceAccount", lambda: get(kubeconfig, "sa", "default", "-n", NS))


def pin_homes(kubeconfig: Path, homes: dict[str, str]) -> None:
    for app, node in homes.items():
        kubectl(kubeconfig, "label", "node", node, f"defrag-home-{app}=yes")


def open_homes(kubeconfig: Path, nodes: list[str], apps: list[str]) -> None:
    """Every node gets every app's home label: a replacement may go anywhere."""
    for node in nodes:
        kubectl(kubeconfig, "label", "node", node, "--overwrite",
                *(f"defrag-home-{app}=yes" for app in apps))


def wait_running(kubeconfig: Path, apps: list[str]) -> dict[str, dict[str, Any]]:
    placed = {}
    for app in apps:
        (pod,) = wait_for(f"{app} Running", lambda app=app: running(kubeconfig, app),
                          timeout_s=DEADLINE_S)
        placed[app] = pod
    return placed


def wait_unschedulable(kubeconfig: Path, name: str) -> None:
    wait_for(f"{name} Unschedulable", lambda: any(
        c.get("reason") == "Unschedulable"
        for c in (get(kubeconfig, "pod", name, "-n", NS) or {}).get("status", {}).get(
            "conditions", [])), timeout_s=DEADLINE_S)


def wait_bound(kubeconfig: Path, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        pod = get(kubeconfig, "pod", name, "-n", NS)
        return pod if pod and pod["spec"].get("nodeName") else None
    result: dict[str, Any] = wait_for(f"{name} bound", bound, timeout_s=DEADLINE_S)
    return result


def replacement(kubeconfig: Path, app: str, old_uid: str) -> dict[str, Any]:
    (pod,) = wait_for(f"{app}'s replacement Running", lambda: [
        p for p in running(kubeconfig, app) if p["metadata"]["uid"] != old_uid],
        timeout_s=DEADLINE_S)
    result: dict[str, Any] = pod
    return result


def start_controller(kubeconfig: Path, tmp: Path, mode: str) -> ControllerProcess:
    (tmp / f"{mode}.yaml").write_text(CONFIG.format(mode=mode))
    (port,) = free_ports(1)
    process = ControllerProcess(kubeconfig, port, tmp / f"defrag-{mode}.log",
                                extender_url="http://127.0.0.1:1", identity=f"defrag-{mode}",
                                lease_name=f"egpu-defrag-{mode}",
                                extra=["--only", "defrag", "--config", str(tmp / f"{mode}.yaml")])
    process.start()
    wait_for("the defrag controller leading", process.leading, timeout_s=60)
    return process


@contextlib.contextmanager
def defrag_controller(kubeconfig: Path, tmp: Path, mode: str) -> Iterator[ControllerProcess]:
    """`start_controller`'s process, stopped on leaving; a failed wait inside names what the
    controller logged and what the API shows (a timeout alone says nothing of why)."""
    process = start_controller(kubeconfig, tmp, mode)
    try:
        yield process
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnosis(kubeconfig, process)}") from err
    finally:
        process.stop()


def diagnosis(kubeconfig: Path, process: ControllerProcess) -> str:
    """The namespace's pods (node, phase, conditions, defrag annotations), its Events, and
    the tail of the controller's log."""
    lines = ["pods:"]
    for pod in pods(kubeconfig):
        meta, status = pod["metadata"], pod.get("status", {})
        notes = {k: v for k, v in (meta.get("annotations") or {}).items() if "defrag" in k
                 or "assign" in k}
        conditions = [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                      for c in status.get("conditions", [])]
        lines.append(f"  {meta['name']} uid={meta['uid']} node={pod['spec'].get('nodeName')} "
                     f"phase={status.get('phase')} deleting={bool(meta.get('deletionTimestamp'))}"
                     f" conditions={conditions} annotations={notes}")
    lines.append("events:")
    for event in (get(kubeconfig, "events", "-n", NS) or {}).get("items", []):
        lines.append(f"  {event.get('lastTimestamp')} {event.get('reason')} "
                     f"{event['involvedObject'].get('name')}: {event.get('message')}")
    log = process.log_path.read_text(errors="replace") if process.log_path.exists() else ""
    lines.append(f"controller log (last 6000 characters):\n{log[-6000:]}")
    return "\n".join(lines)


def over_allocated(kubeconfig: Path) -> list[str]:
    """The independent ledger check (the burst tests'): each card's assignments summed from
    the API's pods, and its DRA claims' allocations (`dra_ledger`), against the GPUDevices'
    cards and the DRA-mode nodes' inventories; and each MIG instance held by one pod or claim
    at most, and carved on the card named."""
    devices = get(kubeconfig, "gpudevices")["items"]
    nodes = gpudevice.nodes_from_objects(devices)
    nodes += dra_inventories((get(kubeconfig, "nodes") or {}).get("items", []))
    claims = (get(kubeconfig, "resourceclaims", "-A") or {}).get("items", [])
    return over_capacity(pods(kubeconfig), claims, nodes)
