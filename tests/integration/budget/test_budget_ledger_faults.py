"""Issue #17, must-show 3: the ledger under faults. 200 GPU pods in two namespaces start and end
over about a minute (kwok starts them on a fake node: real `startedAt`; the test ends them
with a status patch: real `finishedAt`) while `egpu controller` (the budget keeper) is
SIGKILLed 3 times and pods are deleted while it is down, running ones included. Afterwards
the GPU-seconds each GPUBudget recorded equal a recomputation from the pods' own timestamps
(this file's arithmetic, no code of the keeper), within 1%, and none is counted twice (the
sum would exceed it). The webhook gives each GPU pod the keeper's finalizer at CREATE (pods
born, ended and deleted while the keeper is down are held by it alone); every pod is gone at
the end (none held forever)."""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.binding import BY_HAND, binding
from egpu_testing.controller import ControllerProcess
from egpu_testing.pytest_plugin import delete_namespace, unique_name
from egpu_testing.waiting import wait_for
from egpu_testing.webhook import running_webhook
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

PODS = 200
LABEL = "egpu-budget-faults"
SHARES = (25, 50, 100)  # vcuda-core percent


def _seconds(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _stamp(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(name: str, ns: str, percent: int) -> dict[str, Any]:
    """A GPU pod for the test to bind to its node (`egpu_testing.binding`)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": BY_HAND, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "cuda", "resources": {
                         "limits": {"tencent.com/vcuda-core": str(percent)}}}]}}


class Truth:
    """What the test itself knows of each pod: its share and the timestamps the API gave it."""

    def __init__(self) -> None:
        self.share: dict[str, Fraction] = {}
        self.ns: dict[str, str] = {}
        self.start: dict[str, int] = {}
        self.end: dict[str, int] = {}

    def gpu_seconds(self) -> dict[str, Fraction]:
        out: dict[str, Fraction] = {}
        for key, share in self.share.items():
            if key in self.start:
                seconds = max(0, self.end[key] - self.start[key])
                out[self.ns[key]] = out.get(self.ns[key], Fraction(0)) + share * seconds
        return out


def test_ledger_survives_sigkills_and_deletions_while_down(
        k8s_cluster: Any, k8s_namespace: str, fake_gpu_nodes: Callable[..., list[str]],
        tmp_path: Path) -> None:
    from lightkube import Client
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Pod

    from elastic_gpu.kube.crds import install_elasticgpu_crds

    install_elasticgpu_crds(k8s_cluster.kube())
    (node,) = fake_gpu_nodes(1, gpus=8)
    other = unique_name("t")
    k8s_cluster.kubectl("create", "namespace", other)
    namespaces = (k8s_namespace, other)
    client: Any = Client(config=k8s_cluster.client().config, field_manager="budget-faults")
    rng = random.Random(17)
    truth = Truth()
    (port,) = free_ports(1)
    keeper = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                               extender_url="http://127.0.0.1:1", identity=unique_name("keeper"),
                               lease_name=unique_name("budget-faults"), lease=(4, 3, 0.5),
                               extra=["--only", "budgets", "--budget-refresh-seconds", "5"])
    try:
        with running_webhook(k8s_cluster, tmp_path, "budget-wh", LABEL,
                             extra_args=["--budget-finalizer"]) as hook:
            for ns in namespaces:
                k8s_cluster.kubectl("label", "namespace", ns, f"{LABEL}={hook.name}")
                k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
                    "apiVersion": "elasticgpu.io/v1alpha", "kind": "GPUBudget",
                    "metadata": {"name": "budget", "namespace": ns},
                    "spec": {"gpuHours": 1000, "period": "24h"}}))
            keeper.start()
            wait_for("the keeper leading", keeper.leading, 60)

            # the plan: pod i is created at ~0.3 s x i, lives 2-20 s
            plan = [(f"p{i:03d}", namespaces[i % 2], rng.choice(SHARES), rng.uniform(2, 20))
                    for i in range(PODS)]
            kills = {40: 8.0, 100: 8.0, 160: 8.0}  # after creating pod i: down for s
            running: dict[str, float] = {}  # key -> planned end (monotonic)
            ended: list[str] = []
            down_until = 0.0
            deleted_while_down = {"running": 0, "ended": 0, "born_down": 0}

            def read(key: str) -> dict[str, Any]:
                ns, name = key.split("/")
                obj: dict[str, Any] = client.get(Pod, name, namespace=ns).to_dict()
                return obj

            def started_at(obj: dict[str, Any]) -> int | None:
                for status in (obj.get("status") or {}).get("containerStatuses") or []:
                    run = (status.get("state") or {}).get("running")
                    if run and run.get("startedAt"):
                        return _seconds(run["startedAt"])
                return None

            def end(key: str) -> bool:
                obj = read(key)
                start = started_at(obj)
                if start is None:
                    return False  # kwok has not started it yet: later
                finish = max(start, int(time.time()))
                ns, name = key.split("/")
                client.patch(Pod.Status, name, namespace=ns, obj={"status": {
                    "phase": "Succeeded", "containerStatuses": [{
                        "name": "main", "image": "cuda", "imageID": "", "ready": False,
                        "restartCount": 0, "started": False, "state": {"terminated": {
                            "exitCode": 0, "reason": "Completed", "startedAt": _stamp(start),
                            "finishedAt": _stamp(finish)}}}]}})
                truth.start[key], truth.end[key] = start, finish
                return True

            def delete(key: str) -> None:
                """Delete now (grace 0): a running pod ends at its deletionTimestamp."""
                obj = read(key)
                start = started_at(obj)
                ns, name = key.split("/")
                before = int(time.time())
                client.delete(Pod, name, namespace=ns, grace_period=0)
                if key not in truth.end:
                    if start is not None:
                        try:  # held by the finalizer while the keeper is down
                            stamp = read(key)["metadata"]["deletionTimestamp"]
                            truth.end[key] = _seconds(stamp)
                        except ApiError:
                            truth.end[key] = before
                        truth.start[key] = start
                    running.pop(key, None)

            def step() -> None:
                now = time.monotonic()
                for key, due in sorted(running.items(), key=lambda kv: kv[1]):
                    if due <= now and end(key):
                        del running[key]
                        ended.append(key)

            created = 0
            started = time.monotonic()
            born_down: list[str] = []  # created while the keeper is down, short-lived
            deletes_due = 0.0  # when the deletions of this downtime happen
            while created < PODS or running:
                now = time.monotonic()
                if deletes_due and now >= deletes_due:
                    deletes_due = 0.0
                    # late in the downtime: 3 running pods, and the pods born during it
                    # (started and ended while it was down: only the webhook's finalizer
                    # holds them) with older ended ones, 3 in all
                    for key in [k for k in running if read(k).get("status", {}).get(
                            "phase") == "Running"][:3]:
                        delete(key)
                        deleted_while_down["running"] += 1
                    victims = [k for k in born_down if k in ended]
                    victims += [k for k in reversed(ended) if k not in victims]
                    for key in victims[:3]:
                        delete(key)
                        ended.remove(key)
                        deleted_while_down["ended"] += 1
                        deleted_while_down["born_down"] += key in born_down
                    born_down.clear()
                if keeper.process is not None and keeper.process.poll() is not None and \
                        now >= down_until:
                    keeper.start()
                if created < PODS and now - started >= 0.3 * created:
                    name, ns, percent, life = plan[created]
                    if now < down_until and len(born_down) < 3:
                        life = 2.0
                    client.create(Pod.from_dict(_pod(name, ns, percent)))
                    # (kubectl: lightkube decodes the Binding's answer, a Status, as a Binding)
                    k8s_cluster.kubectl("create", "-f", "-",
                                        input=json.dumps(binding(name, ns, node)))
                    key = f"{ns}/{name}"
                    if now < down_until and len(born_down) < 3:
                        born_down.append(key)
                    truth.share[key], truth.ns[key] = Fraction(percent, 100), ns
                    running[key] = time.monotonic() + life
                    created += 1
                    if created in kills:
                        keeper.kill()
                        down_until = time.monotonic() + kills[created]
                        deletes_due = down_until - 2.5
                step()
                time.sleep(0.02)
            assert keeper.starts == 4, "killed 3 times, restarted after each"
            print("deleted while down:", deleted_while_down)
            assert deleted_while_down["running"] == 9 and deleted_while_down["ended"] == 9
            assert deleted_while_down["born_down"] >= 3, "pods born and gone while it was down"

            # everything has ended: delete the rest; the keeper must let every pod go
            for key in list(ended):
                delete(key)
            for ns in namespaces:
                try:
                    wait_for(f"every pod of {ns} gone (finalizers removed after settling)",
                             lambda ns=ns: not list(client.list(Pod, namespace=ns)), 60)
                except AssertionError:
                    for pod in client.list(Pod, namespace=ns):
                        print(json.dumps(pod.to_dict()["metadata"]),
                              json.dumps(pod.to_dict()["status"]))
                    raise

            expected = truth.gpu_seconds()

            def recorded(ns: str) -> dict[str, Any] | None:
                obj = json.loads(k8s_cluster.kubectl(
                    "get", "gpubudget", "budget", "-n", ns, "-o", "json").stdout)
                settled = (obj.get("status") or {}).get("settled") or {}
                return obj if settled and not settled.get("uids") else None

            for ns in namespaces:
                obj = wait_for(f"{ns}'s settled UIDs forgotten", lambda ns=ns: recorded(ns), 30)
                got = Fraction(obj["status"]["settled"]["gpuSeconds"])
                want = expected[ns]
                print(f"{ns}: recorded {float(got):.1f} GPU-s, recomputed {float(want):.1f}")
                assert want > 0
                assert abs(got - want) <= want / 100, (ns, float(got), float(want))  # #17
                # stricter than the issue asks (both sides read the same whole-second
                # timestamps, the runs so far were exact): losing only the pods born and
                # gone while the keeper was down (~0.2%, seen without the webhook's
                # finalizer) fails here
                assert abs(got - want) <= want / 1000, (ns, float(got), float(want))
                assert obj["status"]["used"] == pytest.approx(float(got) / 3600, abs=1e-4)
            assert "Traceback" not in keeper.log_tail(), keeper.log_tail()
    finally:
        keeper.stop()
        delete_namespace(k8s_cluster, other)
