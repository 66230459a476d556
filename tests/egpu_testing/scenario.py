"""A burst of GPU pods against a real control plane, and the independent checks after it.

Used by the integration tests (small) and by bench/sched_*.py (full size): submit every pod at
once, optionally SIGKILL and restart the extender in the middle, wait until binding settles,
then read the pods back from the API and check, without the scheduler's state:
- no card carries more than 100% compute or more memory than it has (annotations summed);
- every bound GPU pod has an assignment for the node it is bound to (nothing lost);
- every pod still pending could not fit on any card (every pod that fits is bound).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from egpu_testing.workbench import (
    card_use_from_pods,
    metric_value,
    overcommitted,
    pod_manifest,
    share_fits_somewhere,
)
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Node
from elastic_gpu.core.request import pod_request_from_manifest

PERCENTS = (10, 20, 25, 30, 40, 50, 60, 75)


def fractional_pods(count: int, scheduler_name: str, namespace: str, seed: int = 0,
                    prefix: str = "burst") -> list[dict[str, Any]]:
    """Pods of 10-75% of a card and 1-32 GiB, in the canonical, vcuda and nano styles."""
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        percent = rng.choice(PERCENTS)
        memory_gib = rng.randrange(1, 33)
        style = i % 3
        if style == 0:
            limits = {"elasticgpu.io/gpu-core": str(percent),
                      "elasticgpu.io/gpu-memory": str(memory_gib * 1024)}
        elif style == 1:
            limits = {"tencent.com/vcuda-core": str(percent),
                      "tencent.com/vcuda-memory": str(memory_gib * 4)}
        else:
            limits = {"nano-gpu/gpu-percent": str(percent),
                      "elasticgpu.io/gpu-memory": str(memory_gib * 1024)}
        pods.append(pod_manifest(f"{prefix}-{i:05d}", namespace, limits=limits,
                                 scheduler_name=scheduler_name))
    return pods


class Progress:
    """How many pods the background creator has created so far."""

    def __init__(self) -> None:
        self.created = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.created += 1


def create_pods(client: Any, pods: Sequence[Mapping[str, Any]], parallelism: int = 16,
                progress: Progress | None = None) -> None:
    from lightkube import codecs

    # Decode in this thread: msgspec's first decode of a type from several threads at once
    # crashes the interpreter (seen with msgspec 0.22).
    objects = [codecs.from_dict(dict(p)) for p in pods]

    def create(obj: Any) -> None:
        for attempt in range(10):
            try:
                client.create(obj)
                break
            except Exception as err:  # an overloaded apiserver answers 429/503: retry
                status = getattr(getattr(err, "response", None), "status_code", None)
                if status not in (429, 500, 503, 504) or attempt == 9:
                    raise
                time.sleep(0.2 * 2 ** attempt)
        if progress is not None:
            progress.add()

    with ThreadPoolExecutor(max_workers=parallelism) as pool:
        for future in [pool.submit(create, obj) for obj in objects]:
            future.result()


def list_pods(client: Any, namespace: str) -> list[dict[str, Any]]:
    from lightkube.resources.core_v1 import Pod

    return [p.to_dict() for p in client.list(Pod, namespace=namespace, chunk_size=1000)]


def bound_count(pods: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))


def unbound_count(client: Any, namespace: str) -> int:
    """Pods not bound yet; only those travel, so polling gets cheaper as binding proceeds."""
    from lightkube.resources.core_v1 import Pod

    return sum(1 for _ in client.list(Pod, namespace=namespace, fields={"spec.nodeName": ""},
                                      chunk_size=1000))


@dataclass
class BurstResult:
    pods: int
    bound: int
    seconds_to_settle: float
    #: Time from the first create to the last bind (the last change of the bound count).
    seconds_to_last_bind: float
    overcommitted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    unbound_but_fit: list[str] = field(default_factory=list)
    timeline: list[tuple[float, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.overcommitted or self.lost or self.unbound_but_fit)

    def summary(self) -> str:
        return (f"{self.bound}/{self.pods} bound, last bind after {self.seconds_to_last_bind:.1f}"
                f" s; overcommitted={self.overcommitted[:3]} lost={self.lost[:3]} "
                f"unbound_but_fit={self.unbound_but_fit[:3]}")


def check(pods: Sequence[Mapping[str, Any]], nodes: Sequence[Node]
          ) -> tuple[list[str], list[str], list[str]]:
    """(overcommitted cards, lost pods, pending pods that would fit) from the API's pods."""
    use = card_use_from_pods(pods)
    lost = []
    unfit = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        node = (pod.get("spec") or {}).get("nodeName")
        text = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        request = pod_request_from_manifest(pod)
        if node:
            if request.wants_gpu and (not text or Assignment.from_json(text).node != node
                                      or (meta.get("annotations") or {}).get(
                                          ann.ASSIGNED_NODE) != node):
                lost.append(f"{key} bound to {node} without a matching assignment")
            continue
        if text:
            continue  # holds its cards (counted above) while kube-scheduler retries it
        for container in request.gpu_containers:
            if share_fits_somewhere(container.compute_milli, container.memory_mib, use, nodes):
                unfit.append(f"{key} ({container.compute_milli} milli, "
                             f"{container.memory_mib} MiB) is pending but fits")
    return overcommitted(use, nodes), lost, unfit


def run_burst(client: Any, namespace: str, pods: Sequence[Mapping[str, Any]],
              nodes: Sequence[Node], *, quiet_s: float = 20.0, timeout_s: float = 600.0,
              on_progress: Callable[[int, float], None] | None = None) -> BurstResult:
    """Create every pod at once, wait until binding settles, check.

    Settled: every pod bound, or the bound count unchanged for `quiet_s` (longer than
    kube-scheduler's 10 s maximum backoff). `on_progress(bound, elapsed)` is called each poll
    (the restart test kills the extender from there).
    """
    started = time.monotonic()
    # Create in the background: binding starts with the first pods, and `on_progress` must
    # see it (the restart test kills the extender while pods are still arriving).
    progress = Progress()
    creator = threading.Thread(target=create_pods, args=(client, pods),
                               kwargs={"progress": progress}, daemon=True)
    creator.start()
    last_change = time.monotonic()
    last_bound = -1
    timeline: list[tuple[float, int]] = []
    while True:
        created = progress.created
        bound = max(0, created - unbound_count(client, namespace))
        now = time.monotonic()
        timeline.append((now - started, bound))
        if bound != last_bound:
            last_bound, last_change = bound, now
        if on_progress is not None:
            on_progress(bound, now - started)
        if not creator.is_alive() and (bound == len(pods) or now - last_change >= quiet_s
                                       or now - started > timeout_s):
            break
        time.sleep(0.5)
    if progress.created < len(pods):
        raise RuntimeError(f"only {progress.created} of {len(pods)} pods could be created")
    current = list_pods(client, namespace)
    over, lost, unfit = check(current, nodes)
    return BurstResult(len(pods), bound, time.monotonic() - started, last_change - started,
                       over, lost, unfit, timeline)


def pods_by_name(client: Any, namespace: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in list_pods(client, namespace)}


def wait_bound(client: Any, namespace: str, names: list[str], timeout_s: float = 60.0
               ) -> dict[str, dict[str, Any]]:
    """Until every pod of `names` has a node; the namespace's pods by name."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = pods_by_name(client, namespace)
        if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names):
            return pods
        if time.monotonic() > deadline:
            pending = [n for n in names if not pods.get(n, {}).get("spec", {}).get("nodeName")]
            raise TimeoutError(f"pods not bound after {timeout_s} s: {pending}")
        time.sleep(0.2)


def unschedulable_reason(client: Any, namespace: str, name: str, timeout_s: float = 30.0) -> str:
    """The message of pod `name`'s PodScheduled condition once kube-scheduler has reported it
    Unschedulable (turned away, with the extender's reasons)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pod = pods_by_name(client, namespace)[name]
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("reason") == "Unschedulable":
                return str(cond.get("message"))
        assert time.monotonic() < deadline, f"pod {name} never turned away"
        time.sleep(0.2)


def wait_extender_knows(url: str, nodes: list[str], cards: int, timeout_s: float = 30.0,
                        context: Any = None) -> None:
    """Until the extender's metrics show every card of `nodes` (its caches have them);
    `context`: an ssl.SSLContext for an HTTPS extender."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5, context=context) as response:
            text = response.read().decode()
        if all(metric_value(text, "elasticgpu_scheduler_card_compute_allocated_millicards"
                            f'{{device_index="{cards - 1}",node="{n}"}}') is not None
               for n in nodes):
            return
        time.sleep(0.2)
    raise TimeoutError(f"extender does not know {nodes} after {timeout_s} s")


def wait_extender_cards(url: str, node: str, models: Mapping[str, str],
                        timeout_s: float = 60.0) -> None:
    """Until the extender holds exactly the cards `models` (uuid -> model) on `node`, each
    healthy, as its metrics say (`card_healthy`, labelled with the uuid and model its
    inventory has): more than `wait_extender_knows`, which counts cards by index only, so a
    card published, then deleted and published again is waited for by what it is."""
    import urllib.request

    sample = re.compile(r'^elasticgpu_scheduler_card_healthy\{(?P<labels>[^}]*)\} (?P<v>\S+)$')
    label = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    seen: dict[str, tuple[str, float]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
        seen = {}
        for line in text.splitlines():
            match = sample.match(line)
            if match is None:
                continue
            labels = dict(label.findall(match["labels"]))
            if labels.get("node") == node:
                seen[labels.get("device_uuid", "")] = (labels.get("model", ""), float(match["v"]))
        if seen == {uuid: (model, 1.0) for uuid, model in models.items()}:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the extender's cards on {node} are {seen} (uuid: (model, healthy)) "
                       f"after {timeout_s} s, not {dict(models)}")

