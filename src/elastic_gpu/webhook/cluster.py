"""The webhook's API calls: its certificate Secret, its registration, the Nodes and the
ElasticGPUClaims it reads, all through `kube.client.KubeClient` (paths by `kube.paths`) and,
for every watch, `kube.informer.Informer`.

All writes are idempotent, so every replica may do them at start: the Secret is created or,
when another replica was first (409), read; a rotation replaces it with a resourceVersion
precondition, and a replica that loses the race (409) takes the winner's; the configurations
are applied server-side.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from elastic_gpu.core.admission.facts import NodeGpus, node_gpus
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.kube.client import APPLY_PATCH, KubeClient
from elastic_gpu.kube.errors import Conflict, NotFound
from elastic_gpu.kube.informer import Handler, Informer, ListWatcher, Obj
from elastic_gpu.kube.paths import Resource
from elastic_gpu.kube.resources import (
    CLAIMS,
    MUTATING_WEBHOOKS,
    NAMESPACES,
    NODES,
    SECRETS,
    VALIDATING_WEBHOOKS,
)
from elastic_gpu.webhook.certs import CertBundle, Lifetimes, create_bundle, plan_rotation

log = logging.getLogger(__name__)

FIELD_MANAGER = "elastic-gpu-webhook"

#: What the webhook reads live for one review, with names that come from the review: read by
#: path (`kube.paths.api_path` checks and escapes every name), never put into paths as they are
#: (issue 26, item 10).
CONFIGURATIONS = {"MutatingWebhookConfiguration": MUTATING_WEBHOOKS,
                  "ValidatingWebhookConfiguration": VALIDATING_WEBHOOKS}
#: After a list or watch fails (the API is down, the watch expired), list again in about a
#: second, as the webhook always has.
RELIST_S = (1.0, 1.0)


def as_events(event: Callable[[str, Obj], None]) -> Handler:
    """An informer's handler that hands each change on as a watch event (kind, object), the
    form the caches here apply."""
    return Handler(on_add=lambda obj: event("ADDED", obj),
                   on_update=lambda _old, obj: event("MODIFIED", obj),
                   on_delete=lambda obj: event("DELETED", obj))


def _decode(data: Mapping[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (data or {}).items()}


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion"))


@dataclass
class StoredBundle:
    bundle: CertBundle
    resource_version: str


class SecretStore:
    """The Secret `namespace/name` holding the CertBundle (type Opaque)."""

    def __init__(self, client: KubeClient, namespace: str, name: str) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name

    async def read(self) -> StoredBundle | None:
        try:
            secret = await self.client.get(SECRETS.path(self.namespace, self.name))
        except NotFound:
            return None
        try:
            bundle = CertBundle.from_data(_decode(secret.get("data")))
        except ValueError as err:
            raise ValueError(f"Secret {self.namespace}/{self.name}: {err}; delete it to have "
                             "a new CA made") from None
        return StoredBundle(bundle, _version(secret))

    async def _ensure_namespace(self) -> None:
        with contextlib.suppress(Conflict):  # (AlreadyExists)
            await self.client.create(NAMESPACES.path(), {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})

    def _secret(self, bundle: CertBundle, resource_version: str | None = None) -> Obj:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/name": FIELD_MANAGER}}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
                "stringData": bundle.to_data()}

    async def create_or_read(self, make: Callable[[], CertBundle]) -> StoredBundle:
        """The stored bundle, made and stored first if there is none. Two replicas starting
        together: one create wins, the other gets 409 and reads the winner's."""
        stored = await self.read()
        if stored is not None:
            return stored
        bundle = make()
        for attempt in range(2):
            try:
                created = await self.client.create(SECRETS.path(self.namespace),
                                                   self._secret(bundle))
                return StoredBundle(bundle, _version(created))
            except NotFound:
                if attempt == 0:  # no namespace yet (dev cluster)
                    await self._ensure_namespace()
                    continue
                raise
            except Conflict:
                break
        stored = await self.read()
        if stored is None:
            raise RuntimeError(f"Secret {self.namespace}/{self.name} conflicted but is gone")
        return stored

    async def replace(self, stored: StoredBundle, bundle: CertBundle) -> StoredBundle:
        """Store `bundle` if the Secret is still at `stored`'s version; else the newer one."""
        try:
            updated = await self.client.update(SECRETS.path(self.namespace, self.name),
                                               self._secret(bundle, stored.resource_version))
            return StoredBundle(bundle, _version(updated))
        except Conflict:
            pass
        newer = await self.read()
        return newer if newer is not None else stored


async def rotate_once(store: SecretStore, current: StoredBundle, hosts: Sequence[str],
                      lifetimes: Lifetimes, now: dt.datetime | None = None) -> StoredBundle:
    """One rotation check: the Secret as it is now (another replica may have rotated), and
    replaced by the next bundle when something is due."""
    latest = await store.read() or current
    now = now or dt.datetime.now(dt.UTC)
    planned = plan_rotation(latest.bundle, hosts, now, lifetimes)
    if planned is None:
        return latest
    return await store.replace(latest, planned)


async def initial_bundle(store: SecretStore, hosts: Sequence[str],
                         lifetimes: Lifetimes) -> StoredBundle:
    return await store.create_or_read(
        lambda: create_bundle(hosts, dt.datetime.now(dt.UTC), lifetimes))


def _configuration_path(obj: Mapping[str, Any]) -> str:
    return CONFIGURATIONS[str(obj["kind"])].path(name=str(obj["metadata"]["name"]))


async def apply_configurations(client: KubeClient, objects: Sequence[dict[str, Any]]) -> None:
    """Server-side apply of the webhook configurations (idempotent, any replica)."""
    for obj in objects:
        await client.patch(_configuration_path(obj), obj, APPLY_PATCH,
                           params={"fieldManager": FIELD_MANAGER, "force": "true"})


class NodeFacts:
    """The GPU nodes, kept by an informer on Nodes; `on_change` runs after each change, and
    once when the first list is in (so the facts exist, if empty)."""

    def __init__(self, on_change: Callable[[Sequence[NodeGpus]], None]) -> None:
        self.nodes: dict[str, NodeGpus] = {}
        self.synced = asyncio.Event()
        self._on_change = on_change

    def _set(self, name: str, gpus: NodeGpus | None) -> bool:
        if gpus is None:
            return self.nodes.pop(name, None) is not None
        if self.nodes.get(name) == gpus:
            return False
        self.nodes[name] = gpus
        return True

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.nodes = {}
        for item in items:
            gpus = node_gpus(item)
            if gpus is not None:
                self.nodes[gpus.name] = gpus
        self._on_change(list(self.nodes.values()))

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        gpus = None if kind == "DELETED" else node_gpus(obj)
        if self._set(name, gpus):
            self._on_change(list(self.nodes.values()))

    async def run(self, client: ListWatcher) -> None:
        """List, then watch (relisting on any error, after about a second), until cancelled."""
        informer = Informer(client, NODES.path(), name="webhook nodes", backoff_s=RELIST_S)
        informer.add_handler(as_events(self.event))
        task = asyncio.create_task(informer.run())
        try:
            await informer.wait_synced()
            self._on_change(list(self.nodes.values()))
            self.synced.set()
            await task
        finally:
            task.cancel()


def _claim(obj: Mapping[str, Any]) -> Claim | None:
    from elastic_gpu.api.elasticgpu import ElasticGPUObjectError, claim_from_object

    try:
        return claim_from_object(obj)
    except (ElasticGPUObjectError, ValueError) as err:
        log.warning("ElasticGPUClaim not read: %s", err)
        return None


T = TypeVar("T")
Key = tuple[str, str]


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class CrdCache(Generic[T]):
    """Objects of `resource` by (namespace, name), each decoded by `decode` (None: unreadable,
    left out), kept by an informer; `on_change()` runs after each change. While the resource
    is not served (its CRD not installed: 404 on the list) the cache is empty and synced, and
    the list is retried every `crd_retry_s`; any other failure lists again after a second."""

    #: the kind in log lines
    kind = "object"

    def __init__(self, resource: Resource, decode: Callable[[Mapping[str, Any]], T | None],
                 crd_retry_s: float = 10.0) -> None:
        self.objects: dict[Key, T] = {}
        self.synced = asyncio.Event()
        self.crd_retry_s = crd_retry_s
        self._resource = resource
        self._decode = decode
        self._informer: Informer | None = None

    @property
    def crd_installed(self) -> bool:
        """Whether the last list found the resource served."""
        return self._informer is not None and self._informer.served

    def on_change(self) -> None:
        """Called after every change of `objects`; nothing by default."""

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        objects: dict[Key, T] = {}
        for item in items:
            value = self._decode(item)
            if value is not None:
                objects[object_key(item)] = value
        self.objects = objects
        self.on_change()

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        key = object_key(obj)
        value = None if kind == "DELETED" else self._decode(obj)
        if value is None:
            if self.objects.pop(key, None) is None:
                return
        else:
            self.objects[key] = value
        self.on_change()

    async def run(self, client: ListWatcher) -> None:
        """List, then watch from the list's version, until cancelled."""
        self._informer = informer = Informer(
            client, self._resource.path(), name=f"webhook {self.kind}s", backoff_s=RELIST_S,
            missing_ok=True, missing_retry_s=self.crd_retry_s)
        informer.add_handler(as_events(self.event))
        task = asyncio.create_task(informer.run())
        try:
            await informer.wait_synced()
            self.synced.set()
            await task
        finally:
            task.cancel()


class ClaimCache(CrdCache[Claim]):
    """The ElasticGPUClaims of every namespace, by (namespace, name). `fetch` reads one claim
    live (a cache miss: a claim created a moment before its pod may not have reached the watch
    yet)."""

    kind = "ElasticGPUClaim"

    def __init__(self, crd_retry_s: float = 10.0) -> None:
        super().__init__(CLAIMS, _claim, crd_retry_s)
        self.client: Any = None
        #: the live reads' client (`kube.client.KubeClient`); None: no live reads
        self.reader: Any = None
        #: live GETs made (a cache hit makes none)
        self.fetches = 0

    @property
    def claims(self) -> dict[Key, Claim]:
        return self.objects

    def get(self, namespace: str, name: str) -> Claim | None:
        return self.objects.get((namespace, name))

    async def fetch(self, namespace: str, name: str) -> Claim | None:
        """The claim as the API has it now (None: it does not exist, or its CRD does not);
        other API errors, and names the API could not hold (`kube.paths.InvalidName`), are
        raised (the caller refuses, saying it could not check)."""
        if self.reader is None:
            return None
        path = CLAIMS.path(namespace, name)  # checked before anything is counted or sent
        self.fetches += 1
        try:
            obj = await self.reader.get(path)
        except NotFound:
            return None
        claim = _claim(obj)
        if claim is not None:
            self.objects[(namespace, name)] = claim
        return claim

    async def run(self, client: ListWatcher) -> None:
        self.client = client
        await super().run(client)
