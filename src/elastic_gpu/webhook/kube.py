"""The webhook's API calls: its certificate Secret, its registration, the Nodes and the
ElasticGPUClaims it reads.

All writes are idempotent, so every replica may do them at start: the Secret is created or,
when another replica was first (409), read; a rotation replaces it with a resourceVersion
precondition, and a replica that loses the race (409) takes the winner's; the configurations
are applied server-side.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from elastic_gpu.api import budget, migsubstitution
from elastic_gpu.api.elasticgpu import CLAIM_PLURAL, GROUP, VERSION
from elastic_gpu.core.admission import NodeGpus, node_gpus
from elastic_gpu.core.claims.model import Claim
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.paths import Resource, group_prefix
from elastic_gpu.webhook.certs import CertBundle, Lifetimes, create_bundle, plan_rotation

log = logging.getLogger(__name__)

FIELD_MANAGER = "elastic-gpu-webhook"

#: What the webhook reads live for one review, with names that come from the review: read by
#: path (`kube.paths.api_path` checks and escapes every name) through a `kube.client.
#: KubeClient`, never by lightkube, which puts names into paths as they are (issue 26, item 10).
_EGPU_API = group_prefix(GROUP, VERSION)
CLAIMS = Resource(_EGPU_API, CLAIM_PLURAL, True)
RULES = Resource(_EGPU_API, migsubstitution.PLURAL, True)
BUDGETS = Resource(_EGPU_API, budget.PLURAL, True)
PRIORITY_CLASSES = Resource(group_prefix("scheduling.k8s.io", "v1"), "priorityclasses", False)


def _status_code(err: BaseException) -> int | None:
    status = getattr(err, "status", None)
    code = getattr(status, "code", None)
    return int(code) if isinstance(code, int) else None


def _decode(data: Mapping[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (data or {}).items()}


@dataclass
class StoredBundle:
    bundle: CertBundle
    resource_version: str


class SecretStore:
    """The Secret `namespace/name` holding the CertBundle (type Opaque)."""

    def __init__(self, client: Any, namespace: str, name: str) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name

    async def read(self) -> StoredBundle | None:
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Secret

        try:
            secret = await self.client.get(Secret, self.name, namespace=self.namespace)
        except ApiError as err:
            if _status_code(err) == 404:
                return None
            raise
        try:
            bundle = CertBundle.from_data(_decode(secret.data))
        except ValueError as err:
            raise ValueError(f"Secret {self.namespace}/{self.name}: {err}; delete it to have "
                             "a new CA made") from None
        return StoredBundle(bundle, str(secret.metadata.resourceVersion))

    async def _ensure_namespace(self) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Namespace

        try:
            await self.client.create(Namespace(metadata=ObjectMeta(name=self.namespace)))
        except ApiError as err:
            if _status_code(err) != 409:
                raise

    async def create_or_read(self, make: Callable[[], CertBundle]) -> StoredBundle:
        """The stored bundle, made and stored first if there is none. Two replicas starting
        together: one create wins, the other gets 409 and reads the winner's."""
        from lightkube.core.exceptions import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Secret

        stored = await self.read()
        if stored is not None:
            return stored
        bundle = make()
        secret = Secret(metadata=ObjectMeta(name=self.name, namespace=self.namespace,
                                            labels={"app.kubernetes.io/name": FIELD_MANAGER}),
                        type="Opaque", stringData=bundle.to_data())
        for attempt in range(2):
            try:
                created = await self.client.create(secret)
                return StoredBundle(bundle, str(created.metadata.resourceVersion))
            except ApiError as err:
                code = _status_code(err)
                if code == 404 and attempt == 0:  # no namespace yet (dev cluster)
                    await self._ensure_namespace()
                    continue
                if code != 409:
                    raise
                break
        stored = await self.read()
        if stored is None:
            raise RuntimeError(f"Secret {self.namespace}/{self.name} conflicted but is gone")
        return stored

    async def replace(self, stored: StoredBundle, bundle: CertBundle) -> StoredBundle:
        """Store `bundle` if the Secret is still at `stored`'s version; else the newer one."""
        from lightkube.core.exceptions import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Secret

        secret = Secret(metadata=ObjectMeta(name=self.name, namespace=self.namespace,
                                            resourceVersion=stored.resource_version,
                                            labels={"app.kubernetes.io/name": FIELD_MANAGER}),
                        type="Opaque", stringData=bundle.to_data())
        try:
            updated = await self.client.replace(secret)
            return StoredBundle(bundle, str(updated.metadata.resourceVersion))
        except ApiError as err:
            if _status_code(err) != 409:
                raise
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


async def apply_configurations(client: Any, objects: Sequence[dict[str, Any]]) -> None:
    """Server-side apply of the webhook configurations (idempotent, any replica)."""
    from lightkube import codecs

    for obj in objects:
        await client.apply(codecs.from_dict(obj), field_manager=FIELD_MANAGER, force=True)


async def delete_configurations(client: Any, name: str) -> None:
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.admissionregistration_v1 import (
        MutatingWebhookConfiguration,
        ValidatingWebhookConfiguration,
    )

    for kind in (MutatingWebhookConfiguration, ValidatingWebhookConfiguration):
        try:
            await client.delete(kind, name)
        except ApiError as err:
            if _status_code(err) != 404:
                raise


class NodeFacts:
    """The GPU nodes, kept by a list and watch of Nodes; `on_change` runs after each change."""

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

    async def run(self, client: Any) -> None:
        """List, then watch from the list's version; on any error (410 Gone included) list
        again after a second."""
        from lightkube.resources.core_v1 import Node

        while True:
            try:
                listing = client.list(Node)
                items = [node.to_dict() async for node in listing]
                self.replace(items)
                self.synced.set()
                async for kind, node in client.watch(Node,
                                                     resource_version=listing.resourceVersion):
                    self.event(str(kind), node.to_dict())
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the API is down or the watch expired: list again
                log.warning("node watch: %s; listing again in 1 s", err)
                await asyncio.sleep(1.0)


def claim_resource() -> Any:
    """lightkube's generic resource for ElasticGPUClaims (namespaced)."""
    from lightkube.generic_resource import create_namespaced_resource

    from elastic_gpu.api.elasticgpu import CLAIM_KIND, CLAIM_PLURAL, GROUP, VERSION

    return create_namespaced_resource(GROUP, VERSION, CLAIM_KIND, CLAIM_PLURAL)


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
    """Objects of `resource()` (a lightkube generic resource) by (namespace, name), each
    decoded by `decode` (None: unreadable, left out); `on_change()` runs after each change."""

    #: the kind in log lines
    kind = "object"
    #: False for a cluster-scoped resource (listed and watched without a namespace)
    namespaced = True

    def __init__(self, resource: Callable[[], Any], decode: Callable[[Mapping[str, Any]], T | None],
                 crd_retry_s: float = 10.0) -> None:
        self.objects: dict[Key, T] = {}
        self.synced = asyncio.Event()
        self.crd_installed = False
        self.crd_retry_s = crd_retry_s
        self._resource = resource
        self._decode = decode

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

    async def run(self, client: Any) -> None:
        """List, then watch from the list's version, until cancelled."""
        from lightkube.core.exceptions import ApiError

        resource = self._resource()
        scope: dict[str, str] = {"namespace": "*"} if self.namespaced else {}
        while True:
            try:
                listing = client.list(resource, **scope)
                self.replace([obj.to_dict() async for obj in listing])
                self.crd_installed = True
                self.synced.set()
                async for kind, obj in client.watch(resource, **scope,
                                                    resource_version=listing.resourceVersion):
                    self.event(str(kind), obj.to_dict())
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if _status_code(err) != 404:
                    log.warning("%s watch: %s; listing again in 1 s", self.kind, err)
                    await asyncio.sleep(1.0)
                    continue
                if self.crd_installed or not self.synced.is_set():
                    log.info("%ss are not served (CRD not installed); checking again every "
                             "%.0f s", self.kind, self.crd_retry_s)
                self.crd_installed = False
                if self.objects:
                    self.objects = {}
                    self.on_change()
                self.synced.set()
                await asyncio.sleep(self.crd_retry_s)
            except Exception as err:  # the API is down or the watch expired: list again
                log.warning("%s watch: %s; listing again in 1 s", self.kind, err)
                await asyncio.sleep(1.0)


class ClaimCache(CrdCache[Claim]):
    """The ElasticGPUClaims of every namespace, by (namespace, name). `fetch` reads one claim
    live (a cache miss: a claim created a moment before its pod may not have reached the watch
    yet)."""

    kind = "ElasticGPUClaim"

    def __init__(self, crd_retry_s: float = 10.0) -> None:
        super().__init__(claim_resource, _claim, crd_retry_s)
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

    async def run(self, client: Any) -> None:
        self.client = client
        await super().run(client)
