"""The pods of this node, as Allocate and the allocation columns need them.

Through the one client stack: live LISTs with `kube.sync.SyncKubeClient`'s blocking verbs, and
the watch cache on a `kube.informer.Informer` that the client runs in its own loop thread.

Two sources, for two kinds of question:

- `PodCache`: every pod bound to this node, kept in memory by an informer (LIST, then WATCH
  from the list's resourceVersion, both with the field selector `spec.nodeName=<node>`; a
  410 Gone relists, other failures relist after a backoff). It serves the readers that
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

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Protocol

from elastic_gpu.core.names import NameRule, check_name
from elastic_gpu.core.podlife import NOT_TERMINAL_SELECTOR
from elastic_gpu.kube.informer import Handler, Informer
from elastic_gpu.kube.resources import PODS
from elastic_gpu.kube.sync import SyncKubeClient

log = logging.getLogger(__name__)

def node_selector(node: str, phase: str | None = None, *, finished: bool = True) -> str:
    """The field selector of `node`'s pods (`spec.nodeName=<node>`), of one `phase`, or, with
    `finished=False`, of those not finished (`core.podlife.NOT_TERMINAL_SELECTOR`)."""
    parts = [f"spec.nodeName={check_name(node, NameRule.SUBDOMAIN, 'node name')}"]
    if phase is not None:
        parts.append(f"status.phase={phase}")
    if not finished:
        parts.append(NOT_TERMINAL_SELECTOR)
    return ",".join(parts)


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


class ApiPods:
    """`PodSource` over a `SyncKubeClient`: live reads (pods as plain dicts, as the API sends
    them), or the cache's for `on_node` once a `PodCache` is attached and synced."""

    def __init__(self, client: SyncKubeClient, cache: PodCache | None = None) -> None:
        self.client = client
        self.cache = cache

    def _list(self, selector: str) -> list[dict[str, Any]]:
        pods, _ = self.client.list(PODS.path(), {"fieldSelector": selector})
        return pods

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return self._list(node_selector(node, "Pending"))

    def live_on_node(self, node: str) -> list[dict[str, Any]]:
        return self._list(node_selector(node, finished=False))

    def on_node(self, node: str) -> list[dict[str, Any]]:
        if self.cache is not None and self.cache.node == node and self.cache.synced:
            return self.cache.pods()
        return self._list(node_selector(node))


class PodCache:
    """Every pod bound to `node`, kept current by a `kube.informer.Informer` (LIST + WATCH,
    bookmarks, 410 Gone relists, failures relist after a backoff of `backoff_s` to
    `max_backoff_s`) that `client` runs in its loop thread. Its handlers run in that thread and
    the readers in the agent's: the pods sit behind one condition. `version` counts changes;
    `wait_change` blocks on it."""

    def __init__(self, client: SyncKubeClient, node: str, *, server_timeout_s: int = 300,
                 backoff_s: float = 0.2, max_backoff_s: float = 10.0) -> None:
        self.client = client
        self.node = node
        self.informer = Informer(
            client.async_client, PODS.path(), name=f"pods of {node}",
            params={"fieldSelector": node_selector(node)}, watch_timeout_s=server_timeout_s,
            backoff_s=(backoff_s, max_backoff_s))
        self.informer.add_handler(Handler(on_add=self._put, on_update=self._update,
                                          on_delete=self._delete))
        self._cond = threading.Condition()
        self._pods: dict[str, dict[str, Any]] = {}
        self._run: Future[None] | None = None
        self.version = 0

    # -- readers --------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.informer.has_synced

    @property
    def relists(self) -> int:
        return self.informer.relists

    @property
    def resource_version(self) -> str | None:
        return self.informer.last_resource_version or None

    def pods(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._pods.values())

    def wait_synced(self, timeout_s: float) -> bool:
        # The informer marks itself synced after its first list's handler calls (none for an
        # empty node), without telling us: look again at short intervals.
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self.synced:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def wait_change(self, seen: int, timeout_s: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout=timeout_s)
            return self.version

    # -- the informer's handlers (in the client's loop thread) -------------------------------

    def _put(self, pod: dict[str, Any]) -> None:
        item = _slim(pod)
        with self._cond:
            self._pods[_uid(item)] = item
            self.version += 1
            self._cond.notify_all()

    def _update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self._put(new)

    def _delete(self, pod: dict[str, Any]) -> None:
        with self._cond:
            self._pods.pop(_uid(pod), None)
            self.version += 1
            self._cond.notify_all()

    # -- running ----------------------------------------------------------------------------

    def start(self) -> None:
        self._run = self.client.run_informer(self.informer)
        self._run.add_done_callback(self._ended)

    def _ended(self, run: Future[None]) -> None:
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        if self._run is not None:
            self._run.cancel()


def _slim(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod without `metadata.managedFields` (often the largest part of a pod, and
    nothing the agent reads), so the cache holds less than the API sends. In place: the
    informer's store keeps the same object."""
    meta = pod.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        pod["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return pod


def _uid(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
