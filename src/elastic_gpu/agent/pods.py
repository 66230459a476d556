"""The pods of this node, as Allocate and the allocation columns need them (lightkube, sync).

Two sources, for two kinds of question:

- `PodCache`: every pod bound to this node, kept in memory by a reflector (LIST, then WATCH
  from the list's resourceVersion, both with the field selector `spec.nodeName=<node>`; a
  410 Gone relists, other failures reconnect with backoff). It serves the readers that
  tolerate a lag of a few milliseconds: GetPreferredAllocation (advisory), the allocation
  columns and holders of the GPUDevices.
- `ApiPods.pending_on_node`: a live, consistent LIST of this node's *Pending* pods. Allocate
  decides on it. A cache can say who is there, but it cannot prove that nobody newer is: when
  kubelet asks for "10 gpu-core" for a pod the watch has not delivered yet, and an older pod
  with the same request is still unadmitted in the cache, the cache names one candidate —
  the wrong one. The live list always contains the pod kubelet is admitting (the scheduler
  bound it before kubelet saw it), and it is small however many pods run on the node: kubelet
  calls Allocate while it admits a pod, before it reports the pod's status, so the pod is
  still `Pending`; running pods are never asked about again (kubelet keeps their devices in
  its own checkpoint), so the field selector `status.phase=Pending` drops them on the server.
- `ApiPods.live_on_node`: a live, consistent LIST of this node's pods that have not finished:
  the node's own ledger Allocate checks the chosen cards against (`accounting.overcommit`); a
  cache could still show a pod whose card the scheduler has already given again.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from typing import Any, Protocol

log = logging.getLogger(__name__)


class PodSource(Protocol):
    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        """This node's Pending pods, read live (consistent)."""
        ...

    def on_node(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to this node; may lag slightly (a cache)."""
        ...

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to this node that has not finished, read live (consistent)."""
        ...


@functools.cache
def raw_pods() -> Any:
    """Pods as plain dicts: lightkube's typed Pod model costs about 1 ms per pod to build
    and convert back, which made Allocate on a busy node ten times slower; a generic resource
    on the same path is just the JSON."""
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource("", "v1", "EgpuRawPod", "pods")


class ApiPods:
    """`PodSource` over a lightkube `Client`: live reads, or the cache's for `on_node` once
    a `PodCache` is attached and synced."""

    def __init__(self, client: Any, cache: PodCache | None = None) -> None:
        self.client = client
        self.cache = cache
        self._raw = raw_pods()

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        pods = self.client.list(self._raw, namespace="*",
                                fields={"spec.nodeName": node, "status.phase": "Pending"})
        return [dict(pod) for pod in pods]

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        from lightkube import operators

        pods = self.client.list(self._raw, namespace="*", fields={
            "spec.nodeName": node, "status.phase": operators.not_in(["Succeeded", "Failed"])})
        return [dict(pod) for pod in pods]

    def on_node(self, node: str) -> list[dict[str, Any]]:
        if self.cache is not None and self.cache.node == node and self.cache.synced:
            return self.cache.pods()
        pods = self.client.list(self._raw, namespace="*", fields={"spec.nodeName": node})
        return [dict(pod) for pod in pods]


class PodCache:
    """Every pod bound to `node`, kept current by LIST + WATCH (a reflector) on a thread.

    Bookkeeping as client-go's reflector does it: the WATCH starts at the LIST's
    resourceVersion and carries on from the last event's (bookmarks included); "410 Gone"
    (the version left the apiserver's window) relists; a dropped connection or another error
    waits (exponential backoff with jitter, `backoff_s` to `max_backoff_s`) and watches again
    from the last version. `version` counts changes; `wait_change` blocks on it."""

    def __init__(self, client: Any, node: str, *, server_timeout_s: int = 300,
                 backoff_s: float = 0.2, max_backoff_s: float = 10.0) -> None:
        self.client = client
        self.node = node
        self.server_timeout_s = server_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._raw = raw_pods()
        self._cond = threading.Condition()
        self._pods: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resource_version: str | None = None
        self.synced = False
        self.version = 0
        self.relists = 0

    # -- readers --------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._pods.values())

    def wait_synced(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.synced, timeout=timeout_s)

    def wait_change(self, seen: int, timeout_s: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout=timeout_s)
            return self.version

    # -- the reflector ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        # The watch is a blocking HTTP stream: the thread ends at its next event or when the
        # server closes it (server_timeout_s); it is a daemon, so nothing waits for it.
        self._stop.set()

    def _run(self) -> None:
        delay = self.backoff_s
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._watch()
                delay = self.backoff_s
            except Exception as err:
                if self._stop.is_set():
                    return
                if _gone(err):
                    log.info("pod watch of %s: resourceVersion expired, relisting", self.node)
                    self.resource_version = None
                    continue
                log.warning("pod watch of %s: %s; retrying in %.1f s", self.node, err, delay)
                self._stop.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.max_backoff_s)

    def _relist(self) -> None:
        listing = self.client.list(self._raw, namespace="*", fields={"spec.nodeName": self.node})
        pods = {}
        for pod in listing:
            item = _slim(dict(pod))
            pods[_uid(item)] = item
        with self._cond:
            self._pods = pods
            self.resource_version = listing.resourceVersion
            self.synced = True
            self.relists += 1
            self.version += 1
            self._cond.notify_all()

    def _watch(self) -> None:
        events = self.client.watch(self._raw, namespace="*", fields={"spec.nodeName": self.node},
                                   resource_version=self.resource_version,
                                   server_timeout=self.server_timeout_s)
        for kind, obj in events:
            if self._stop.is_set():
                return
            item = _slim(dict(obj))
            with self._cond:
                self.resource_version = str(obj.metadata.resourceVersion)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self._pods.pop(_uid(item), None)
                else:
                    self._pods[_uid(item)] = item
                self.version += 1
                self._cond.notify_all()


def _slim(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod without `metadata.managedFields` (often the largest part of a pod, and
    nothing the agent reads), so the cache holds less than the API sends."""
    meta = pod.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        pod["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return pod


def _uid(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _gone(err: Exception) -> bool:
    status = getattr(err, "status", None)
    return getattr(status, "code", None) == 410
