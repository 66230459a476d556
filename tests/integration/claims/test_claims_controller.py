"""`egpu controller` on the real kube-apiserver (issue #15): static binding, Pending reasons as
conditions and Events, reclaim Retain / Delete, the claim-protection finalizer, Lost,
provisioning through `POST /provision` (a test double that creates the ElasticGPU in the API
as the extender does, egpu_testing.controller.ProvisionDouble), retry when capacity frees,
a controller SIGKILLed mid-way, and leader election between two replicas (must-show 4).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.controller import ControllerProcess, ProvisionDouble, clean_up
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core.claims.model import BOUND_CONDITION, GPUSHARE, WHOLE_CARDS
from elastic_gpu.core.claims.pods import CLAIM_PROTECTION_FINALIZER
from elastic_gpu.devcluster.ports import free_ports

pytestmark = pytest.mark.integration

SHARE = {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
         "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}


@dataclass
class Env:
    cluster: Any
    ns: str
    double: ProvisionDouble
    tmp: Path
    ctl: ControllerProcess | None = None
    classes: list[str] = field(default_factory=list)
    egpus: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.cluster.kubectl(*args, **kw)

    def create(self, obj: dict[str, Any], namespaced: bool = True) -> None:
        args = ["create", "-f", "-"] + (["-n", self.ns] if namespaced else [])
        self.kubectl(*args, input=json.dumps(obj))

    def get(self, kind: str, name: str, namespaced: bool = True) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", self.ns] if namespaced else [])
        result = self.kubectl(*args, check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def claim(self, name: str) -> dict[str, Any] | None:
        return self.get("egpuc", name)

    def egpu(self, name: str) -> dict[str, Any] | None:
        return self.get("egpu", name, namespaced=False)

    def events(self, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        out = self.kubectl("get", "events", "-n", namespace or self.ns, "-o", "json",
                           "--field-selector", f"involvedObject.name={name}").stdout
        return list(json.loads(out)["items"])

    def reasons(self, name: str, namespace: str | None = None) -> set[str]:
        return {e["reason"] for e in self.events(name, namespace)}

    def egpus_of(self, claim_uid: str) -> list[dict[str, Any]]:
        items = json.loads(self.kubectl("get", "egpu", "-o", "json").stdout)["items"]
        return [e for e in items if ((e["spec"].get("claimRef") or {}).get("uid")) == claim_uid]

    def controller(self, identity: str = "ctl-a", lease: tuple[float, float, float] = (15, 10, 2),
                   lease_name: str = "egpu-controller", extra: tuple[str, ...] = ()
                   ) -> ControllerProcess:
        (port,) = free_ports(1)
        return ControllerProcess(self.cluster.kubeconfig, port, self.tmp / f"{identity}.log",
                                 extender_url=self.double.url, identity=identity,
                                 lease_name=lease_name, lease_namespace=self.ns, lease=lease,
                                 extra=extra)


def new_class(env: Env, *, reclaim: str = "Delete", mode: str = "Immediate",
              provisioner: str = GPUSHARE, name: str | None = None) -> str:
    name = name or unique_name("cls")
    env.create({"apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": name},
                "provisioner": provisioner, "reclaimPolicy": reclaim, "egpuBindingMode": mode},
               namespaced=False)
    env.classes.append(name)
    return name


def new_claim(env: Env, cls: str | None = None, egpu: str | None = None,
              requests: dict[str, Any] | None = None, name: str | None = None) -> str:
    name = name or unique_name("claim")
    spec: dict[str, Any] = {"resources": {"requests": requests or SHARE}}
    if cls is not None:
        spec["egpuClassName"] = cls
    if egpu is not None:
        spec["elasticGPUName"] = egpu
    env.create({"apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": name},
                "spec": spec})
    return name


def new_egpu(env: Env, capacity: dict[str, Any], name: str | None = None) -> str:
    name = name or unique_name("pre")
    # the card it names, as an agent publishes it: a pre-created ElasticGPU is Available only
    # once its node, index and uuid are found in the GPUDevices (issue #26 item 6)
    from elastic_gpu.api.gpudevice import card_to_object
    from elastic_gpu.core.model import Card

    env.kubectl("apply", "-f", "-", input=json.dumps(card_to_object(
        "node-static", Card(3, "GPU-static-3", "Tesla T4", 16384))))
    env.create({"apiVersion": api.API_VERSION, "kind": api.EGPU_KIND, "metadata": {"name": name},
                "spec": {"capacity": capacity, "node": "node-static",
                         "cards": [{"index": 3, "uuid": "GPU-static-3", "milli": 500,
                                    "memoryMiB": 8192}]}}, namespaced=False)
    env.egpus.append(name)
    return name


def phase(obj: dict[str, Any] | None) -> str | None:
    return None if obj is None else (obj.get("status") or {}).get("phase")


def bound_condition(obj: dict[str, Any] | None) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == BOUND_CONDITION:
            return dict(cond)
    return {}


def wait_phase(env: Env, name: str, want: str, timeout_s: float = 30.0) -> dict[str, Any]:
    return dict(wait_for(f"claim {name} {want}",
                         lambda: (c := env.claim(name)) is not None and phase(c) == want and c,
                         timeout_s))


@pytest.fixture
def env(k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> Iterator[Env]:
    from elastic_gpu.api import gpudevice
    from elastic_gpu.kube.crds import install_crds as install

    install_crds(k8s_cluster)
    install(k8s_cluster.kube(), [gpudevice.crd_manifest()])  # the inventory (new_egpu)
    (port,) = free_ports(1)
    double = ProvisionDouble(k8s_cluster.kubeconfig, port, node=unique_name("node"), slots=2)
    double.start()
    env = Env(k8s_cluster, k8s_namespace, double, tmp_path)
    try:
        yield env
    finally:
        double.stop()
        clean_up(k8s_cluster, k8s_namespace, env.classes, env.egpus)


@pytest.fixture
def running(env: Env) -> Iterator[Env]:
    ctl = env.ctl = env.controller()
    ctl.start()
    try:
        wait_for("the controller to lead", ctl.leading)
        yield env
    finally:
        ctl.stop()


def test_static_binding_to_a_precreated_elasticgpu(running: Env) -> None:
    env = running
    egpu = new_egpu(env, {"elasticgpu.io/gpu-core": 50, "elasticgpu.io/gpu-memory": 8192})
    wait_for("a pre-created ElasticGPU to be Available", lambda: phase(env.egpu(egpu)) == "Available")
    name = new_claim(env, egpu=egpu, requests={"elasticgpu.io/gpu-core": 20})
    claim = wait_phase(env, name, "Bound")
    assert claim["status"]["elasticGPUName"] == egpu and claim["status"]["node"] == "node-static"
    assert CLAIM_PROTECTION_FINALIZER in claim["metadata"]["finalizers"]
    cond = bound_condition(claim)
    assert (cond["status"], cond["reason"]) == ("True", "Bound")
    obj = env.egpu(egpu)
    assert obj is not None and phase(obj) == "Bound"
    assert obj["spec"]["claimRef"] == {"namespace": env.ns, "name": name,
                                       "uid": claim["metadata"]["uid"]}
    wait_for("Bound events", lambda: "Bound" in env.reasons(name)
             and "Bound" in env.reasons(egpu, "default"))
    assert env.ctl is not None
    metrics = env.ctl.metrics()
    assert 'elasticgpu_claims{phase="Bound"}' in metrics
    assert 'elasticgpu_controller_reconciles_total{controller="claims",result="ok"}' in metrics
    assert "elasticgpu_controller_leader 1.0" in metrics


def test_pending_reasons_are_conditions_and_events(running: Env) -> None:
    env = running
    missing = unique_name("nocls")
    no_class = new_claim(env, cls=missing)
    small = new_egpu(env, {"elasticgpu.io/gpu-core": 5})
    too_small = new_claim(env, egpu=small, requests={"elasticgpu.io/gpu-core": 20})
    wrong = new_claim(env, cls=new_class(env, provisioner=WHOLE_CARDS))
    for name, reason, words in (
            (no_class, "ClassNotFound", f"ElasticGPUClass {missing} does not exist"),
            (too_small, "ElasticGPUTooSmall", "compute milli 200 > 50"),
            (wrong, "InvalidRequest", "provisions whole cards")):
        cond = wait_for(f"{name} Pending {reason}",
                        lambda n=name, r=reason: (c := bound_condition(env.claim(n))).get("reason")
                        == r and c)
        assert cond["status"] == "False" and words in cond["message"], cond
        assert phase(env.claim(name)) == "Pending"
        wait_for(f"a {reason} Warning event", lambda n=name, r=reason: any(
            e["reason"] == r and e["type"] == "Warning" for e in env.events(n)))
    # the missing class appears: the claim is provisioned and bound without any other nudge
    new_class(env, name=missing)
    claim = wait_phase(env, no_class, "Bound")
    assert claim["status"]["elasticGPUName"] == f"egpu-{claim['metadata']['uid']}"
    wait_for("one Provisioned event", lambda: "Provisioned" in env.reasons(no_class))
    assert "Bound" not in env.reasons(no_class)  # provisioned and bound: one Event says both


def test_wait_for_first_consumer_binds_what_the_extender_provisions_at_bind(running: Env) -> None:
    env = running
    name = new_claim(env, cls=new_class(env, mode="WaitForFirstConsumer"))
    cond = wait_for("WaitForFirstConsumer", lambda: (c := bound_condition(env.claim(name)))
                    .get("reason") == "WaitForFirstConsumer" and c)
    assert cond["status"] == "False" and phase(env.claim(name)) == "Pending"
    wait_for("a Normal event", lambda: any(e["reason"] == "WaitForFirstConsumer" and
                                           e["type"] == "Normal" for e in env.events(name)))
    assert env.double.calls == 0  # nothing provisioned before a consumer is placed
    # the extender provisions at the first consumer's bind: egpu-<uid>, pre-bound to the claim
    claim = env.claim(name)
    assert claim is not None
    uid = claim["metadata"]["uid"]
    env.create({"apiVersion": api.API_VERSION, "kind": api.EGPU_KIND,
                "metadata": {"name": f"egpu-{uid}"},
                "spec": {"capacity": SHARE, "node": "node-w", "reclaimPolicy": "Delete",
                         "cards": [{"index": 1, "uuid": "GPU-w-1", "milli": 100, "memoryMiB": 4}],
                         "claimRef": {"namespace": env.ns, "name": name, "uid": uid}}},
               namespaced=False)
    claim = wait_phase(env, name, "Bound")
    assert claim["status"]["node"] == "node-w"
    assert claim["spec"]["elasticGPUName"] == f"egpu-{uid}"
    assert phase(env.egpu(f"egpu-{uid}")) == "Bound"


def test_reclaim_retain_keeps_the_elasticgpu_released_and_delete_deletes_it(running: Env) -> None:
    env = running
    retain = new_claim(env, cls=new_class(env, reclaim="Retain"))
    delete = new_claim(env, cls=new_class(env, reclaim="Delete"))
    kept = wait_phase(env, retain, "Bound")["status"]["elasticGPUName"]
    gone = wait_phase(env, delete, "Bound")["status"]["elasticGPUName"]
    env.kubectl("delete", "egpuc", retain, delete, "-n", env.ns, "--wait=false")
    wait_for("claims deleted (no pod uses them)",
             lambda: env.claim(retain) is None and env.claim(delete) is None)
    released = wait_for("Retain: Released", lambda: (e := env.egpu(kept)) is not None
                        and phase(e) == "Released" and e)
    assert released["spec"]["cards"], "a released ElasticGPU keeps its cards"
    assert "Retain" in released["status"]["message"]
    wait_for("Delete: the ElasticGPU is deleted", lambda: env.egpu(gone) is None)
    wait_for("Released / Deleted events", lambda: "Released" in env.reasons(kept, "default")
             and "Deleted" in env.reasons(gone, "default"))


def test_a_claim_in_use_is_deleted_only_after_its_pods(running: Env) -> None:
    env = running
    name = new_claim(env, cls=new_class(env))
    wait_phase(env, name, "Bound")
    pod = unique_name("user")
    env.create({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "annotations": {"egpuc.elasticgpu.io/main": name}},
                "spec": {"schedulerName": "nobody", "containers": [
                    {"name": "main", "image": "busybox"}]}})
    env.kubectl("delete", "egpuc", name, "-n", env.ns, "--wait=false")
    wait_for("the WaitingForPods event", lambda: "WaitingForPods" in env.reasons(name))
    time.sleep(1.0)
    claim = env.claim(name)
    assert claim is not None and claim["metadata"].get("deletionTimestamp")
    env.kubectl("delete", "pod", pod, "-n", env.ns, "--grace-period=0", "--force")
    wait_for("the claim to disappear once its pod is gone", lambda: env.claim(name) is None)


def test_a_claim_deleted_while_the_controller_was_down_is_bound_then_released_with_its_pod(
        env: Env) -> None:
    """Issue #39: a WaitForFirstConsumer claim whose pod came while the controller was down
    (the extender provisioned egpu-<uid> for it at the pod's bind), then deleted. The restarted
    controller binds it (Bound to that ElasticGPU, which the pod holds) and keeps it for the
    pod; once the pod is gone the claim goes, its ElasticGPU with it (reclaim Delete), and the
    card is provisioned again. Before, the claim stayed Terminating without phase or
    elasticGPUName while its ElasticGPU held the card."""
    env.double.slots = 1  # one card: whoever holds it, nothing else is provisioned
    ctl = env.ctl = env.controller()
    ctl.start()
    try:
        wait_for("lead", ctl.leading)
        name = new_claim(env, cls=new_class(env, mode="WaitForFirstConsumer"))
        wait_for("WaitForFirstConsumer", lambda: bound_condition(env.claim(name))
                 .get("reason") == "WaitForFirstConsumer")
        ctl.kill()
        claim = env.claim(name)
        assert claim is not None
        uid = claim["metadata"]["uid"]
        egpu = f"egpu-{uid}"
        # what the extender does at the pod's bind: egpu-<uid>, pre-bound to the claim, on the
        # card it chose (the double's only one); the pod (never started here) names the claim
        env.create({"apiVersion": api.API_VERSION, "kind": api.EGPU_KIND,
                    "metadata": {"name": egpu},
                    "spec": {"capacity": SHARE, "node": env.double.node,
                             "reclaimPolicy": "Delete",
                             "cards": [{"index": 0, "uuid": "GPU-double-0", "milli": 100,
                                        "memoryMiB": 4}],
                             "claimRef": {"namespace": env.ns, "name": name, "uid": uid}}},
                   namespaced=False)
        pod = unique_name("user")
        env.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "annotations": {"egpuc.elasticgpu.io/main": name}},
                    "spec": {"schedulerName": "nobody", "containers": [
                        {"name": "main", "image": "busybox"}]}})
        env.kubectl("delete", "egpuc", name, "-n", env.ns, "--wait=false")

        ctl.start()
        wait_for("lead again", ctl.leading)
        bound = wait_phase(env, name, "Bound")
        assert bound["metadata"].get("deletionTimestamp"), "the claim went under its pod"
        assert bound["spec"]["elasticGPUName"] == bound["status"]["elasticGPUName"] == egpu
        assert bound["status"]["node"] == env.double.node
        assert bound_condition(bound)["status"] == "True"
        assert phase(env.egpu(egpu)) == "Bound"
        wait_for("the WaitingForPods event", lambda: "WaitingForPods" in env.reasons(name))
        late = new_claim(env, cls=new_class(env))  # Immediate: the only card is the pod's
        wait_for("the late claim Unschedulable", lambda: bound_condition(env.claim(late))
                 .get("reason") == "Unschedulable")

        env.kubectl("delete", "pod", pod, "-n", env.ns, "--grace-period=0", "--force")
        wait_for("the claim to go with its pod", lambda: env.claim(name) is None)
        wait_for("its ElasticGPU deleted (reclaim Delete)", lambda: env.egpu(egpu) is None)
        made = env.egpu(wait_phase(env, late, "Bound")["status"]["elasticGPUName"])
        assert made is not None and [c["index"] for c in made["spec"]["cards"]] == [0]
    finally:
        ctl.stop()


def test_lost_when_the_bound_elasticgpu_disappears(running: Env) -> None:
    env = running
    egpu = new_egpu(env, {"elasticgpu.io/gpu-core": 50})
    name = new_claim(env, egpu=egpu, requests={"elasticgpu.io/gpu-core": 10})
    wait_phase(env, name, "Bound")
    env.kubectl("delete", "egpu", egpu)
    claim = wait_phase(env, name, "Lost")
    assert bound_condition(claim)["reason"] == "ElasticGPUMissing"
    wait_for("a Lost event", lambda: "Lost" in env.reasons(name))


def test_unschedulable_claim_is_bound_when_capacity_frees(env: Env) -> None:
    # a first retry 30 s away: only the capacity-freeing requeue can bind it quickly
    ctl = env.controller(extra=("--backoff-base", "30", "--backoff-max", "60"))
    ctl.start()
    try:
        wait_for("lead", ctl.leading)
        cls = new_class(env, reclaim="Delete")
        first = [new_claim(env, cls=cls) for _ in range(2)]  # the double's node has 2 cards
        for name in first:
            wait_phase(env, name, "Bound")
        late = new_claim(env, cls=cls)
        cond = wait_for("Unschedulable", lambda: (c := bound_condition(env.claim(late)))
                        .get("reason") == "Unschedulable" and c)
        assert "all 2 cards held" in cond["message"] and phase(env.claim(late)) == "Pending"
        wait_for("a ProvisioningFailed event", lambda: "ProvisioningFailed" in env.reasons(late))
        env.kubectl("delete", "egpuc", first[0], "-n", env.ns)
        wait_phase(env, late, "Bound", timeout_s=15)
    finally:
        ctl.stop()


def test_controller_killed_midway_finishes_the_job(env: Env) -> None:
    env.double.slots = 100
    cls = new_class(env)
    ctl = env.controller()
    ctl.start()
    wait_for("lead", ctl.leading)
    names = [new_claim(env, cls=cls) for _ in range(30)]
    wait_for("some claims bound", lambda: env.double.created)
    ctl.kill()
    ctl.start()
    try:
        wait_for("all bound after the restart", lambda: all(
            phase(env.claim(n)) == "Bound" for n in names), timeout_s=60)
    finally:
        ctl.stop()
    for name in names:
        claim = env.claim(name)
        assert claim is not None
        uid = claim["metadata"]["uid"]
        egpus = env.egpus_of(uid)
        assert [e["metadata"]["name"] for e in egpus] == [f"egpu-{uid}"]
        assert phase(egpus[0]) == "Bound" and claim["spec"]["elasticGPUName"] == f"egpu-{uid}"
    assert len(set(env.double.created)) == len(env.double.created) == 30


# ---------------------------------------------------------------- leader election (must-show 4)

LEASE = (4.0, 3.0, 0.5)  # duration, renew deadline, retry period: short for the test


def lease_holder(env: Env, name: str) -> str | None:
    obj = env.get("lease", name)
    return None if obj is None else (obj["spec"].get("holderIdentity") or "")


def test_two_replicas_one_leads_sigkill_hands_over_within_the_lease(env: Env) -> None:
    env.double.slots = 1000
    lease = unique_name("lease")
    a = env.controller("ctl-a", LEASE, lease)
    b = env.controller("ctl-b", LEASE, lease)
    a.start()
    wait_for("a leads", a.leading)
    b.start()
    time.sleep(2 * LEASE[2] * 1.2 + 1)
    assert a.leading() and not b.leading(), "exactly one replica leads"
    assert lease_holder(env, lease) == "ctl-a"
    assert "elasticgpu_controller_leader 1.0" in a.metrics()
    assert "elasticgpu_controller_leader 0.0" in b.metrics()
    cls = new_class(env)
    names = [new_claim(env, cls=cls) for _ in range(15)]
    a.kill()
    killed = time.monotonic()
    names += [new_claim(env, cls=cls) for _ in range(15)]  # created during the hand-over
    wait_for("b leads", b.leading, timeout_s=LEASE[0] + 10)
    handover = time.monotonic() - killed
    assert lease_holder(env, lease) == "ctl-b"
    # within the lease duration of the last renewal b saw, plus one retry period
    assert handover <= LEASE[0] + LEASE[2] * 1.2 + 2.0, handover
    try:
        wait_for("all claims bound", lambda: all(phase(env.claim(n)) == "Bound" for n in names),
                 timeout_s=60)
        for name in names:  # no double provisioning
            claim = env.claim(name)
            assert claim is not None
            assert len(env.egpus_of(claim["metadata"]["uid"])) == 1
        assert len(env.double.created) == len(set(env.double.created)) == len(names)
    finally:
        b.stop()


def test_clean_shutdown_releases_the_lease_at_once(env: Env) -> None:
    lease = unique_name("lease")
    slow = (30.0, 20.0, 0.5)  # a long lease: only a release can hand over quickly
    a = env.controller("ctl-a", slow, lease)
    b = env.controller("ctl-b", slow, lease)
    a.start()
    wait_for("a leads", a.leading)
    b.start()
    a.stop()  # SIGTERM
    assert a.process is not None and a.process.returncode == 0
    assert lease_holder(env, lease) in ("", "ctl-b")
    stopped = time.monotonic()
    try:
        wait_for("b leads", b.leading, timeout_s=10)
        assert time.monotonic() - stopped < 10 < slow[0]
    finally:
        b.stop()


def test_a_leader_whose_lease_is_taken_exits_nonzero(env: Env) -> None:
    lease = unique_name("lease")
    a = env.controller("ctl-a", LEASE, lease)
    a.start()
    wait_for("a leads", a.leading)
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    env.kubectl("patch", "lease", lease, "-n", env.ns, "--type=merge", "-p", json.dumps(
        {"spec": {"holderIdentity": "intruder", "renewTime": now, "acquireTime": now}}))
    assert a.process is not None
    a.process.wait(LEASE[1] + 10)
    assert a.process.returncode == 1
    assert "leadership lost" in a.log_path.read_text()
    assert lease_holder(env, lease) == "intruder"  # not released: it was not ours any more


def test_the_deployed_rbac_is_enough(env: Env) -> None:
    """deploy/controller/rbac.yaml: with only those rights the controller leads, binds a
    provisioned claim (finalizer, ElasticGPU, status, Events) and deletes a released one."""
    import yaml

    repo = Path(__file__).resolve().parents[3]
    env.kubectl("create", "namespace", "elastic-gpu", check=False)
    env.kubectl("apply", "-f", str(repo / "deploy/controller/rbac.yaml"))
    token = env.kubectl("create", "token", "elastic-gpu-controller", "-n",
                        "elastic-gpu").stdout.strip()
    admin = yaml.safe_load(env.cluster.kubeconfig.read_text())
    kubeconfig = env.tmp / "sa.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
    (port,) = free_ports(1)
    ctl = ControllerProcess(kubeconfig, port, env.tmp / "rbac.log", extender_url=env.double.url,
                            identity="rbac", lease_namespace="elastic-gpu")
    ctl.start()
    try:
        wait_for("lead", ctl.leading)
        name = new_claim(env, cls=new_class(env, reclaim="Delete"))
        claim = wait_phase(env, name, "Bound")
        egpu = claim["status"]["elasticGPUName"]
        wait_for("events", lambda: "Provisioned" in env.reasons(name))
        env.kubectl("delete", "egpuc", name, "-n", env.ns)
        wait_for("the ElasticGPU deleted", lambda: env.egpu(egpu) is None)
        assert "Forbidden" not in ctl.log_path.read_text()
    finally:
        ctl.stop()


def test_a_gpu_pod_ending_retries_unschedulable_claims_at_once(env: Env) -> None:
    """Capacity may free when a pod holding GPUs is deleted: Unschedulable claims are retried
    then, not at their next backoff (30 s here)."""
    from elastic_gpu.core import annotations as ann

    env.double.slots = 0
    ctl = env.controller(extra=("--backoff-base", "30", "--backoff-max", "60"))
    ctl.start()
    try:
        wait_for("lead", ctl.leading)
        pod = unique_name("gpu-pod")
        env.create({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "annotations": {ann.ASSIGNMENT: "{}"}},
                    "spec": {"schedulerName": "nobody",
                             "containers": [{"name": "main", "image": "busybox"}]}})
        late = new_claim(env, cls=new_class(env))
        wait_for("Unschedulable", lambda: bound_condition(env.claim(late)).get("reason")
                 == "Unschedulable")
        time.sleep(1.0)
        calls = env.double.calls
        env.kubectl("delete", "pod", pod, "-n", env.ns, "--grace-period=0", "--force")
        wait_for("a retry right after the GPU pod is gone", lambda: env.double.calls > calls,
                 timeout_s=10)
    finally:
        ctl.stop()
