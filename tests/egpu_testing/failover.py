"""Replicated services behind stand-in Services, and a steady stream of GPU pods and claims:
the failover test (tests/integration/scheduler/test_sched_failover.py) and its benchmark
(bench/sched_failover.py).

- The extender: two `egpu scheduler` processes with `leaderElection.enabled` on a Lease of the
  test's namespace (`ExtenderPair`); kube-scheduler and the controller reach them through
  `devcluster.readyproxy`, which stands in for the chart's Service and kube-proxy (the dev
  control plane runs no kube-proxy): each new connection goes to the replica whose /readyz
  answers 200, the leader.
- The webhook: two `egpu webhook` processes sharing one serving Secret (`WebhookPair`), both
  serving; kube-apiserver calls the registration's URL, a forwarder that spreads connections
  over the ready replicas as kube-proxy spreads a Service's.
- The controller: two `egpu controller` processes on one Lease (`ControllerPair`); only the
  holder reconciles.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egpu_testing.claims_burst import ClaimsReport, card_use_with_elasticgpus, check_claims
from egpu_testing.controller import ControllerProcess
from egpu_testing.scenario import Progress, create_pods, list_pods
from egpu_testing.webhook import WebhookProcess
from egpu_testing.workbench import ExtenderProcess, share_fits_somewhere
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.readyproxy import Backend, ReadyForwarder


class ExtenderPair:
    """Replicas "a" and "b" of one extender (one Lease, one schedulerName) and the
    forwarder in front of them (`url`: what kube-scheduler's extender stanza names)."""

    def __init__(self, kubeconfig: Path, work_dir: Path, namespace: str,
                 config: Mapping[str, Any] | None = None) -> None:
        *ports, front = free_ports(3)  # the forwarder's known before it starts: `url`
        self.lease = f"egpu-scheduler-{uuid.uuid4().hex[:8]}"
        self.namespace = namespace
        settings = {"leaderElection": {"enabled": True, "leaseNamespace": namespace,
                                       "leaseName": self.lease}, **dict(config or {})}
        first = ExtenderProcess(kubeconfig, ports[0], work_dir / "extender-a.log", settings,
                                args=["--identity", "a"])
        second = ExtenderProcess(kubeconfig, ports[1], work_dir / "extender-b.log", settings,
                                 scheduler_name=first.scheduler_name, args=["--identity", "b"])
        self.replicas = (first, second)
        self.scheduler_name = first.scheduler_name
        #: replicas that exited by themselves (a lost Lease) and were started again
        self.exited = 0
        self.forwarder = ReadyForwarder([Backend.parse(f"127.0.0.1:{p}") for p in ports],
                                        port=front)

    @property
    def url(self) -> str:
        return self.forwarder.url

    def start(self) -> None:
        """"a" leads (it starts first, alone), "b" stands by with its caches synced."""
        self.forwarder.start_in_thread()
        self.replicas[0].start()
        self.replicas[1].start(standby=True)

    def leader(self) -> ExtenderProcess | None:
        serving = [r for r in self.replicas if r.readyz()[0] == 200]
        assert len(serving) <= 1, "two replicas serve at once"
        return serving[0] if serving else None

    def wait_leader(self, timeout_s: float = 60.0, other_than: ExtenderProcess | None = None
                    ) -> ExtenderProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.restart_exited()
            leader = self.leader()
            if leader is not None and leader is not other_than:
                return leader
            time.sleep(0.05)
        raise TimeoutError(f"no replica leads after {timeout_s:.0f} s:\n" + self.log_tails())

    def restart_exited(self) -> None:
        """Start again, as a standby, a replica that exited by itself (a leader whose renewals
        failed for the renew deadline exits 1 to come back as a standby: kubelet restarts it),
        not one SIGKILLed; `exited` counts them."""
        for replica in self.replicas:
            process = replica.process
            if process is not None and process.poll() is not None and process.returncode > 0:
                self.exited += 1
                replica.start(standby=True)

    def lease_acquired(self, client: Any) -> tuple[str, float]:
        """(holder, acquireTime as wall-clock seconds) of the replicas' Lease."""
        return lease_acquired(client, self.namespace, self.lease)

    def standby_of(self, leader: ExtenderProcess) -> ExtenderProcess:
        return self.replicas[1] if leader is self.replicas[0] else self.replicas[0]

    def log_tails(self) -> str:
        return "\n".join(f"---- {r.log_path.name}\n{r.log_tail()}" for r in self.replicas)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()
        self.forwarder.stop()


def lease_acquired(client: Any, namespace: str, name: str) -> tuple[str, float]:
    """(holder, acquireTime as wall-clock seconds) of a Lease."""
    from lightkube.resources.coordination_v1 import Lease

    spec = client.get(Lease, name=name, namespace=namespace).spec
    return str(spec.holderIdentity), spec.acquireTime.timestamp()


class WebhookPair:
    """Replicas "a" and "b" of one `egpu webhook` (one name, one serving Secret in its own
    namespace, governing the namespaces labelled `label=<name>`), both serving, registered at
    the forwarder in front of them (`url`), as the chart registers its Service."""

    def __init__(self, kubeconfig: Path, work_dir: Path, label: str) -> None:
        *ports, front = free_ports(3)
        self.name = f"egpu-webhook-{uuid.uuid4().hex[:8]}"
        self.label = label
        self.forwarder = ReadyForwarder(
            [Backend.parse(f"127.0.0.1:{p}", f"https://127.0.0.1:{p}") for p in ports],
            port=front)
        self.replicas = tuple(
            WebhookProcess(kubeconfig, port, work_dir / f"webhook-{tag}.log", name=self.name,
                           namespace=self.name, label=(label, self.name),
                           extra_args=["--url", self.url])
            for tag, port in zip("ab", ports, strict=True))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.forwarder.port}"

    def start(self) -> None:
        self.forwarder.start_in_thread()
        for replica in self.replicas:  # one after the other: the first makes the Secret
            replica.start()

    def answered(self) -> list[float]:
        """AdmissionReviews each replica has answered (0 for a dead one)."""
        return [r.metric("elasticgpu_webhook_requests_total") for r in self.replicas]

    def log_tails(self) -> str:
        return "\n".join(f"---- {r.log_path.name}\n{r.log_tail()}" for r in self.replicas)

    def stop(self, plane: Any) -> None:
        from egpu_testing.webhook import cleanup_webhook

        for replica in self.replicas:
            cleanup_webhook(plane, replica)
        self.forwarder.stop()


class ControllerPair:
    """Replicas "a" and "b" of `egpu controller` on one Lease (`lease`: duration, renew
    deadline, retry period), calling the extender at `extender_url`."""

    def __init__(self, kubeconfig: Path, work_dir: Path, namespace: str, extender_url: str,
                 lease: Sequence[float] = (15, 10, 2)) -> None:
        ports = free_ports(2)
        self.namespace = namespace
        self.lease_name = f"egpu-controller-{uuid.uuid4().hex[:8]}"
        self.replicas = tuple(
            ControllerProcess(kubeconfig, port, work_dir / f"controller-{tag}.log",
                              extender_url=extender_url, identity=f"ctl-{tag}",
                              lease_name=self.lease_name, lease_namespace=namespace,
                              lease=lease)
            for tag, port in zip("ab", ports, strict=True))

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def leader(self) -> ControllerProcess | None:
        leading = [r for r in self.replicas if r.leading()]
        assert len(leading) <= 1, "two controllers lead at once"
        return leading[0] if leading else None

    def wait_leader(self, timeout_s: float = 120.0, other_than: ControllerProcess | None = None
                    ) -> ControllerProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader is not other_than:
                return leader
            self.restart_exited()
            time.sleep(0.1)
        raise TimeoutError(f"no controller leads after {timeout_s:.0f} s:\n" + self.log_tails())

    def restart_exited(self) -> None:
        """Start again a replica that exited by itself (a leader that could not renew in
        time exits 1 to come back as a follower: kubelet restarts it), not one SIGKILLed."""
        for replica in self.replicas:
            process = replica.process
            if process is not None and process.poll() is not None and process.returncode > 0:
                replica.start()

    def other(self, replica: ControllerProcess) -> ControllerProcess:
        return self.replicas[1] if replica is self.replicas[0] else self.replicas[0]

    def log_tails(self) -> str:
        return "\n".join(f"---- {r.log_path.name}\n{r.log_tail()}" for r in self.replicas)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()


@dataclass
class ObjectStream:
    """Create `objects` (pods and claims, as dicts) at a steady `per_second` in a background
    thread. A create refused by a failing webhook (kube-apiserver answers 500, "failed calling
    webhook", with `failurePolicy: Fail`) or an overloaded API server is retried every 0.1 s,
    as a ReplicaSet controller retries, for up to `give_up_s`; each refusal is noted (when,
    what). `created_at`: when each object's create returned (wall clock)."""

    client: Any
    objects: Sequence[Mapping[str, Any]]
    per_second: float
    give_up_s: float = 60.0
    progress: Progress = field(default_factory=Progress)
    stop: threading.Event = field(default_factory=threading.Event)
    created_at: dict[str, float] = field(default_factory=dict)
    refusals: list[tuple[float, str, str]] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    #: `created_at` is written by the stream's thread and read by the rig's: a garbage
    #: collection inside a copy can switch threads and grow the dict mid-iteration
    _created_lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> threading.Thread:
        from lightkube import codecs

        # decoded here, in one thread (msgspec's first decode of a type from several threads
        # at once crashed the interpreter: scenario.create_pods)
        decoded = [codecs.from_dict(dict(o)) for o in self.objects]
        thread = threading.Thread(target=self._run, args=(decoded,), name="object-stream",
                                  daemon=True)
        thread.start()
        return thread

    def _run(self, decoded: Sequence[Any]) -> None:
        started = time.monotonic()
        for i, (obj, body) in enumerate(zip(decoded, self.objects, strict=True)):
            if self.stop.is_set():
                return
            delay = started + i / self.per_second - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._create(obj, str(body["metadata"]["name"]))

    def _create(self, obj: Any, name: str) -> None:
        give_up = time.monotonic() + self.give_up_s
        while True:
            try:
                self.client.create(obj)
            except Exception as err:
                status = getattr(getattr(err, "response", None), "status_code", None)
                if status not in (429, 500, 503, 504):
                    raise
                self.refusals.append((time.time(), name, str(err)[:300]))
                if time.monotonic() > give_up:
                    self.given_up.append(name)
                    return
                time.sleep(0.1)
                continue
            with self._created_lock:
                self.created_at[name] = time.time()
            self.progress.add()
            return

    def names_created_after(self, moment: float) -> list[str]:
        with self._created_lock:
            return [n for n, t in self.created_at.items() if t > moment]

    def created_between(self, start: float, end: float) -> dict[str, float]:
        with self._created_lock:
            return {n: t for n, t in self.created_at.items() if start <= t <= end}

    def refusals_between(self, start: float, end: float) -> list[tuple[float, str, str]]:
        return [r for r in list(self.refusals) if start <= r[0] <= end]


def stream_pods(client: Any, pods: Sequence[Mapping[str, Any]], per_second: float,
                progress: Progress, stop: threading.Event | None = None) -> threading.Thread:
    """Create `pods` at a steady `per_second` in a background thread (returned, started);
    `stop` ends the stream early."""
    def run() -> None:
        started = time.monotonic()
        for i, pod in enumerate(pods):
            if stop is not None and stop.is_set():
                return
            delay = started + i / per_second - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            create_pods(client, [pod], parallelism=1, progress=progress)

    thread = threading.Thread(target=run, name="pod-stream", daemon=True)
    thread.start()
    return thread


def interleave(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]]
               ) -> list[Mapping[str, Any]]:
    """Pods and claims in one stream, each kind spread evenly over it."""
    keyed = [((i + 0.5) / len(pods), 0, p) for i, p in enumerate(pods)]
    keyed += [((i + 0.5) / len(claims), 1, c) for i, c in enumerate(claims)]
    return [o for _, _, o in sorted(keyed, key=lambda k: (k[0], k[1]))]


def share_claims(count: int, namespace: str, class_name: str, prefix: str = "claim"
                 ) -> list[dict[str, Any]]:
    """Claims of 10% of a card and 1 GiB."""
    share = "gpushare.provisioner.elasticgpu.io"
    return [{"apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND,
             "metadata": {"name": f"{prefix}-{i:05d}", "namespace": namespace},
             "spec": {"egpuClassName": class_name, "resources": {"requests": {
                 f"{share}/gpu-core": 10, f"{share}/gpu-memory": 1024}}}}
            for i in range(count)]


def create_immediate_class(plane: Any, name: str) -> None:
    plane.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": name},
        "provisioner": "gpushare.provisioner.elasticgpu.io", "reclaimPolicy": "Delete",
        "egpuBindingMode": "Immediate"}))


@dataclass
class LedgerReport:
    """The independent checks after a failover run, read back from the API."""

    claims: ClaimsReport
    pods: int
    pods_bound: int
    lost_pods: list[str]
    pending_pods_that_fit: list[str]

    @property
    def ok(self) -> bool:
        return self.claims.ok and not (self.lost_pods or self.pending_pods_that_fit)

    def summary(self) -> str:
        return (f"{self.pods_bound}/{self.pods} pods bound, lost={self.lost_pods[:3]} "
                f"pending_but_fit={self.pending_pods_that_fit[:3]}; {self.claims.summary()}")


def check_ledger(pods: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]],
                 egpus: Sequence[Mapping[str, Any]], nodes: Sequence[Node]) -> LedgerReport:
    """Cards summed over the pods' assignments and every ElasticGPU (none over capacity, no
    claim bound twice or lost, every pending claim unable to fit: `claims_burst.check_claims`),
    every bound GPU pod holding an assignment for its node, and no pending pod that would fit
    beside all of that."""
    report = check_claims(claims, egpus, pods, nodes)
    use = card_use_with_elasticgpus(pods, egpus)
    lost, unfit, bound = [], [], 0
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        node = (pod.get("spec") or {}).get("nodeName")
        text = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        request = pod_request_from_manifest(pod)
        if node:
            bound += 1
            if request.wants_gpu and (not text or Assignment.from_json(text).node != node
                                      or (meta.get("annotations") or {}).get(
                                          ann.ASSIGNED_NODE) != node):
                lost.append(f"{key} bound to {node} without a matching assignment")
            continue
        if text:
            continue  # holds its cards (counted) while kube-scheduler retries it
        for container in request.gpu_containers:
            if share_fits_somewhere(container.compute_milli, container.memory_mib, use, nodes):
                unfit.append(f"{key} ({container.compute_milli} milli, "
                             f"{container.memory_mib} MiB) is pending but fits")
    return LedgerReport(report, len(pods), bound, lost, unfit)


def read_ledger(plane: Any, client: Any, namespace: str, nodes: Sequence[Node]) -> LedgerReport:
    """`check_ledger` on the namespace's pods and claims and the ElasticGPUs on `nodes`."""
    claims = json.loads(plane.kubectl("get", "egpuc", "-n", namespace, "-o", "json").stdout
                        )["items"]
    ours = {n.name for n in nodes}
    egpus = [e for e in json.loads(plane.kubectl("get", "egpu", "-o", "json").stdout)["items"]
             if (e.get("spec") or {}).get("node") in ours]
    return check_ledger(list_pods(client, namespace), claims, egpus, nodes)


class FirstSeenClock:
    """When each object of a namespace was first seen in a state (`reached(obj)`, on the
    object as a dict): wall-clock seconds, comparable with a Lease's acquireTime written on
    the same machine, from a watch."""

    def __init__(self, client: Any, resource: Any, namespace: str,
                 reached: Callable[[Mapping[str, Any]], bool]) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.reached = reached
        self.seen_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="first-seen-clock", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for _, obj in self.client.watch(self.resource, namespace=self.namespace):
                    if self._stop.is_set():
                        return
                    body = obj.to_dict()
                    if self.reached(body):
                        with self._lock:
                            self.seen_at.setdefault(str(body["metadata"]["name"]), time.time())
            except Exception:  # the watch ended or broke: watch again
                time.sleep(0.1)

    def first_after(self, moment: float, names: Sequence[str] | None = None) -> float | None:
        """The earliest time after `moment` an object (of `names`, if given) was seen."""
        with self._lock:
            later = [t for n, t in self.seen_at.items()
                     if t > moment and (names is None or n in names)]
        return min(later) if later else None

    def seen(self, names: Sequence[str]) -> dict[str, float]:
        with self._lock:
            return {n: self.seen_at[n] for n in names if n in self.seen_at}

    def count_between(self, start: float, end: float) -> int:
        with self._lock:
            return sum(1 for t in self.seen_at.values() if start < t < end)

    @contextmanager
    def running(self) -> Iterator[FirstSeenClock]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()


def _pod_bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _claim_bound(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("phase") == "Bound")


class BindClock(FirstSeenClock):
    """When each pod of `namespace` was first seen bound."""

    def __init__(self, client: Any, namespace: str) -> None:
        from lightkube.resources.core_v1 import Pod

        super().__init__(client, Pod, namespace, _pod_bound)


class ClaimClock(FirstSeenClock):
    """When each ElasticGPUClaim of `namespace` was first seen Bound."""

    def __init__(self, client: Any, namespace: str) -> None:
        super().__init__(client, claim_resource(), namespace, _claim_bound)


def claim_resource() -> Any:
    """lightkube's class for ElasticGPUClaims."""
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource(api.GROUP, api.VERSION, api.CLAIM_KIND, api.CLAIM_PLURAL)


#: What a failover round may SIGKILL: the serving extender, a webhook replica, the controller
#: leader.
COMPONENTS = ("extender", "webhook", "controller")


@dataclass(frozen=True)
class KillResult:
    """One round: what was killed and how long until things created after it were bound."""

    killed: tuple[str, ...]
    #: the first pod created after the kill, bound
    pod_bound_s: float
    #: the first claim created after the kill, Bound (None: the stream has no claims)
    claim_bound_s: float | None
    #: the first pod bound after the new extender leader's acquireTime (pods created before
    #: the kill included; the measure of the extender-only benchmark); None when the extender
    #: was not killed
    pod_after_takeover_s: float | None
    #: component -> its standby's Lease acquireTime, from the kill
    takeover_s: Mapping[str, float]
    #: creates refused (webhook failures) from the kill to the end of the round, and the last
    #: one's time from the kill
    refused: int
    last_refusal_s: float | None
    #: wall clock of the SIGKILL and of the new extender leader seen serving (None: not killed)
    killed_at: float = 0.0
    served_at: float | None = None

    def line(self) -> str:
        takeover = ", ".join(f"{c} Lease taken {t:.2f} s" for c, t in self.takeover_s.items())
        refused = (f"{self.refused} creates refused, the last {self.last_refusal_s:.2f} s after"
                   if self.last_refusal_s is not None else "no create refused")
        after = (f", first pod bound after the takeover {self.pod_after_takeover_s:.2f} s"
                 if self.pod_after_takeover_s is not None else "")
        claim = (f", next claim Bound {self.claim_bound_s:.2f} s"
                 if self.claim_bound_s is not None else "")
        return (f"killed {'+'.join(self.killed)}: next pod bound {self.pod_bound_s:.2f} s"
                f"{claim}{after}; "
                f"{takeover + '; ' if takeover else ''}{refused}")


@dataclass
class FailoverRig:
    """The three replicated services under one stream of pods and claims, and the clocks that
    time recovery; `kill` runs one round."""

    client: Any
    extenders: ExtenderPair
    webhooks: WebhookPair
    controllers: ControllerPair
    stream: ObjectStream
    pods: FirstSeenClock
    #: None: the stream has no claims (the extender-only runs)
    claims: FirstSeenClock | None
    _answered: list[float] = field(default_factory=list)

    def ready(self, timeout_s: float = 120.0) -> None:
        """Every replica up: the killed ones restarted (standby / follower), a leader of each."""
        leader = self.extenders.wait_leader(timeout_s)
        standby = self.extenders.standby_of(leader)
        if standby.process is None or standby.process.poll() is not None:
            standby.start(timeout_s=timeout_s, standby=True)
        for hook in self.webhooks.replicas:
            if hook.process is None or hook.process.poll() is not None:
                hook.start(timeout_s)
        self.controllers.wait_leader(timeout_s)
        for controller in self.controllers.replicas:
            if controller.process is None or controller.process.poll() is not None:
                controller.start(timeout_s)
        self._answered = self.webhooks.answered()

    def _busier_webhook(self) -> WebhookProcess:
        """The replica that answered more since `ready` (the one kube-apiserver's kept-alive
        connections reach: the one whose death refuses requests)."""
        now = self.webhooks.answered()
        grown = [n - b for n, b in zip(now, self._answered or [0.0, 0.0], strict=True)]
        return self.webhooks.replicas[0 if grown[0] >= grown[1] else 1]

    def kill(self, targets: Sequence[str], timeout_s: float = 120.0) -> KillResult:
        unknown = set(targets) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown components {sorted(unknown)}")
        extender = self.extenders.wait_leader(timeout_s) if "extender" in targets else None
        controller = self.controllers.wait_leader(timeout_s) if "controller" in targets else None
        hook = self._busier_webhook() if "webhook" in targets else None
        killed_at = time.time()
        for victim in (extender, hook, controller):
            if victim is not None:
                victim.kill()
        takeover: dict[str, float] = {}
        after_takeover: float | None = None
        served_at: float | None = None
        if extender is not None:
            self.extenders.wait_leader(timeout_s, other_than=extender)
            served_at = time.time()
            _, acquired = self.extenders.lease_acquired(self.client)
            takeover["extender"] = acquired - killed_at
            after_takeover = self._wait(lambda: self.pods.first_after(max(acquired, killed_at)),
                                        timeout_s, "a pod bound after the takeover")
        if controller is not None:
            self.controllers.wait_leader(timeout_s, other_than=controller)
            _, acquired = lease_acquired(self.client, self.controllers.namespace,
                                         self.controllers.lease_name)
            takeover["controller"] = acquired - killed_at
        pod_bound = self._wait(lambda: self.pods.first_after(
            killed_at, self.stream.names_created_after(killed_at)), timeout_s,
            "a pod created after the kill, bound")
        claims = self.claims
        claim_bound = None if claims is None else self._wait(lambda: claims.first_after(
            killed_at, self.stream.names_created_after(killed_at)), timeout_s,
            "a claim created after the kill, Bound")
        refusals = self.stream.refusals_between(killed_at, time.time())
        return KillResult(
            tuple(targets), pod_bound - killed_at,
            None if claim_bound is None else claim_bound - killed_at,
            None if after_takeover is None else after_takeover - killed_at, takeover,
            len(refusals), max(r[0] for r in refusals) - killed_at if refusals else None,
            killed_at, served_at)

    def _wait(self, found: Callable[[], float | None], timeout_s: float, what: str) -> float:
        deadline = time.monotonic() + timeout_s
        while (moment := found()) is None:
            # kubelet's part, should a new leader give up: an extender's renew deadline is
            # 1.5 s, which a replica starved on a loaded machine can miss after taking over
            self.extenders.restart_exited()
            self.controllers.restart_exited()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout_s:.0f} s:\n"
                                   + self.extenders.log_tails() + self.controllers.log_tails()
                                   + self.webhooks.log_tails())
            time.sleep(0.02)
        return moment
