"""The scheduler's API worker: a child process that does all of its Kubernetes API I/O.

kube-scheduler waits for the extender's filter answer inside its one scheduling loop, so any
delay there is lost throughput. Bind calls (TLS, JSON, a round trip to the API server) and the
watch streams (several events per scheduled pod) cost far more Python time than a filter; in
the same process they queue ahead of the next pod's filter. Here they run in a second process
(another core), and the scheduler process gets only slim objects, only when they changed
(`slim.ChangeFilter`). Protocol: `ipc`. Started and restarted by `worker_link.WorkerLink`.

    python -m elastic_gpu.scheduler.apiworker [--kubeconfig PATH] [--log-level LEVEL]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from elastic_gpu.api import elasticgpu
from elastic_gpu.core.podlife import NOT_TERMINAL_SELECTOR
from elastic_gpu.kube.informer import Reflector
from elastic_gpu.kube.kubeconfig import ClientConfigError
from elastic_gpu.kube.paths import InvalidName
from elastic_gpu.kube.resources import CLAIMS, CLASSES, ELASTICGPUS, GPUDEVICES, NODES, PODS
from elastic_gpu.kube.transport import ApiStatusError, RestClient
from elastic_gpu.runtime import eventloop, gcpolicy
from elastic_gpu.runtime.logging import setup_logging
from elastic_gpu.scheduler import ipc
from elastic_gpu.scheduler.slim import (
    ChangeFilter,
    ListedDevice,
    ListedNode,
    ListedPod,
    Obj,
    slim_claim,
    slim_class,
    slim_device,
    slim_elasticgpu,
    slim_node,
    slim_pod,
)

log = logging.getLogger("elastic_gpu.scheduler.apiworker")

#: Terminated pods hold nothing; with this selector they leave the watch as DELETED events.
LIVE_PODS = NOT_TERMINAL_SELECTOR

#: The Elastic GPU API's resources the scheduler may read or create through the worker.
EGPU_RESOURCES = {
    elasticgpu.EGPU_PLURAL: ELASTICGPUS,
    elasticgpu.CLAIM_PLURAL: CLAIMS,
    elasticgpu.CLASS_PLURAL: CLASSES,
}

FEEDS: dict[str, tuple[str, dict[str, str], Callable[[Obj], Obj]]] = {
    "nodes": (NODES.path(), {}, slim_node),
    "gpudevices": (GPUDEVICES.path(), {}, slim_device),
    "pods": (PODS.path(), {"fieldSelector": LIVE_PODS}, slim_pod),
    "elasticgpus": (EGPU_RESOURCES[elasticgpu.EGPU_PLURAL].path(), {}, slim_elasticgpu),
    "elasticgpuclaims": (EGPU_RESOURCES[elasticgpu.CLAIM_PLURAL].path(), {}, slim_claim),
    "elasticgpuclasses": (EGPU_RESOURCES[elasticgpu.CLASS_PLURAL].path(), {}, slim_class),
}
#: The big feeds' lists and watch events decode only what their slim form reads
#: (`slim.ListedPod`): a pod or node event is not built whole to be slimmed at once.
SHAPES: dict[str, type[msgspec.Struct]] = {
    "nodes": ListedNode, "gpudevices": ListedDevice, "pods": ListedPod}
#: Feeds of the Elastic GPU API's CRDs: not installed (404) means none exist, checked again
#: this often (docs/scheduler.md, "ElasticGPUs in the ledger").
OPTIONAL_FEEDS = frozenset({"elasticgpus", "elasticgpuclaims", "elasticgpuclasses"})
MISSING_RECHECK_S = 30.0
#: Objects the scheduler may read or create by path through the worker ("get", "create").
SLIM_BY_PLURAL: dict[str, Callable[[Obj], Obj]] = {
    elasticgpu.EGPU_PLURAL: slim_elasticgpu, elasticgpu.CLAIM_PLURAL: slim_claim,
    elasticgpu.CLASS_PLURAL: slim_class}


def binding_body(namespace: str, name: str, uid: str, node: str, resource_version: int | None,
                 annotations: dict[str, str]) -> bytes:
    """pods/<name>/binding honours metadata.uid and metadata.resourceVersion as preconditions
    and copies metadata.annotations onto the pod in the same write."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if resource_version is not None:
        meta["resourceVersion"] = str(resource_version)
    if annotations:
        meta["annotations"] = annotations
    return msgspec.json.encode({"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                                "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


#: The pod condition a wake-up sets (docs/scheduler.md, "Waking pending pods").
WAKEUP_CONDITION = "elasticgpu.io/GPUCapacityFreed"


def wakeup_patch(uid: str, message: str, now: datetime.datetime) -> bytes:
    """A strategic-merge patch of pods/<name>/status that sets our condition (merged by type:
    kube-scheduler's PodScheduled condition is untouched). Any change to a pending pod is an
    update event kube-scheduler retries an extender-rejected pod on; the message carries a
    counter so that every wake-up changes the object. metadata.uid is a precondition: a pod
    re-created under the same name is not woken for its predecessor."""
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return msgspec.json.encode({
        "metadata": {"uid": uid},
        "status": {"conditions": [{"type": WAKEUP_CONDITION, "status": "True",
                                   "reason": "GPUCapacityFreed", "message": message,
                                   "lastProbeTime": stamp, "lastTransitionTime": stamp}]}})


class Worker:
    def __init__(self, client: RestClient, send: Callable[[ipc.WorkerMessage], None]) -> None:
        self.client = client
        self.send = send
        #: feed -> the task running its reflector, and that reflector (`start`, `resync`)
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.running: dict[str, Reflector] = {}

    def reflectors(self) -> list[Reflector]:
        return [self.reflector(feed) for feed in FEEDS]

    def reflector(self, feed: str, listed: asyncio.Event | None = None) -> Reflector:
        """The reflector of one feed; `listed` is set once its first list has been sent."""
        path, params, slim = FEEDS[feed]
        changes = ChangeFilter()

        def on_page(items: list[Obj], first: bool, last: bool) -> None:
            # Each page goes on as it comes, slim: the worker never holds a whole list (at
            # 15,000 nodes, 120,000 pods), only the change filter's digest of each object.
            slimmed = [slim(o) for o in items]
            items.clear()  # the page as served: not kept past its slim form
            if first:
                changes.begin_list()
            changes.listed(slimmed)
            if last:
                changes.end_list()
            self.send(ipc.Page(feed, first, last, slimmed))
            if last and listed is not None:
                listed.set()

        def on_event(kind: str, obj: Obj) -> None:
            slimmed = slim(obj)
            if changes.changed(kind, slimmed):
                self.send(ipc.Event(feed, kind, slimmed))

        return Reflector(self.client, path, name=feed, params=params, on_page=on_page,
                         shape=SHAPES.get(feed),
                         on_event=on_event, missing_ok=feed in OPTIONAL_FEEDS,
                         missing_retry_s=MISSING_RECHECK_S)

    def _run(self, feed: str, reflector: Reflector) -> None:
        self.running[feed] = reflector
        self.tasks[feed] = asyncio.create_task(reflector.run(), name=f"reflector-{feed}")

    def start(self) -> None:
        for feed in FEEDS:
            self._run(feed, self.reflector(feed))

    async def catch_up(self, feed: str, wait_s: float, poll_s: float = 0.01) -> str:
        """Return once everything the API held for `feed` when this was called has been sent
        (a barrier: docs/architecture.md, "Extender high availability"). The collection's
        current resourceVersion is read with a one-item consistent list; watch events come in
        resourceVersion order, so once the watch has passed that version every earlier change
        has been sent. A quiet collection may not move for a long time: after `wait_s` the
        feed is listed again instead (`resync`). Returns how: "watch" or "relist"."""
        path, params, _ = FEEDS[feed]
        page = msgspec.json.decode(await self.client.request(
            "GET", path, params={**params, "limit": "1"}), type=_Page)
        target = _version(page.metadata.get("resourceVersion"))
        deadline = asyncio.get_running_loop().time() + wait_s
        while target is not None and asyncio.get_running_loop().time() < deadline:
            reflector = self.running.get(feed)
            seen = _version(reflector.last_resource_version) if reflector else None
            if seen is not None and seen >= target:
                return "watch"
            await asyncio.sleep(poll_s)
        await self.resync(feed)
        return "relist"

    async def resync(self, feed: str) -> None:
        """List `feed` again (a consistent read: what the API holds now) and send it as a
        replace before returning; its watch then resumes from that list. A new leader does
        this for pods before it serves (docs/architecture.md, "Extender high availability"):
        every Binding the previous leader wrote is then in the state, however far behind the
        watch was."""
        old = self.tasks.pop(feed, None)
        if old is not None:
            old.cancel()
            await asyncio.gather(old, return_exceptions=True)
        listed = asyncio.Event()
        self._run(feed, self.reflector(feed, listed))
        await listed.wait()

    async def handle(self, request: ipc.Request) -> None:
        """Do one request and send its reply, an error included: the scheduler never waits
        for an answer that does not come."""
        try:
            result = await self._answer(request)
        except ApiStatusError as err:
            self._fail(request.id, str(err), err.definite, err.code)
        except InvalidName as err:  # refused before any request: certainly not applied
            self._fail(request.id, str(err), True, 400)
        except Exception as err:
            log.exception("request %s failed", ipc.tag(request))
            self._fail(request.id, f"{type(err).__name__}: {err}", False, 0)
        else:
            self.send(ipc.Reply(request.id, result, None))

    def refuse(self, err: ipc.MessageError) -> None:
        """A frame that is not a request: answered, definite (nothing was done), if the id
        it carried could be read; otherwise the scheduler's call times out."""
        log.error("the scheduler sent %s", err)
        if err.request_id is not None:
            self._fail(err.request_id, f"malformed request: {err}", True, 0)

    def _fail(self, request_id: int, text: str, definite: bool, code: int) -> None:
        self.send(ipc.Reply(request_id, None, ipc.RequestError(text, definite, code)))

    async def _answer(self, request: ipc.Request) -> ipc.Result:
        match request:
            case ipc.Bind():
                await self.client.request(
                    "POST", PODS.path(request.namespace, request.name, "binding"),
                    body=binding_body(request.namespace, request.name, request.uid,
                                      request.node, request.resource_version,
                                      request.annotations))
                return None
            case ipc.Wake():
                await self.client.request(
                    "PATCH", PODS.path(request.namespace, request.name, "status"),
                    body=wakeup_patch(request.uid, request.message,
                                      datetime.datetime.now(datetime.UTC)),
                    content_type="application/strategic-merge-patch+json")
                return None
            case ipc.Resync():
                await self.resync(_feed(request.feed))
                return None
            case ipc.CatchUp():
                return await self.catch_up(_feed(request.feed), request.wait_s)
            case ipc.GetPod():
                try:
                    raw = await self.client.request(
                        "GET", PODS.path(request.namespace, request.name))
                except ApiStatusError as err:
                    if err.code != 404:
                        raise
                    return None
                return slim_pod(msgspec.json.decode(raw))
            case ipc.GetEgpuObject():
                found = await self._get_optional(
                    _object_path(request.plural, request.namespace, request.name))
                return None if found is None else SLIM_BY_PLURAL[request.plural](found)
            case ipc.CreateElasticGpu():
                created = msgspec.json.decode(await self.client.request(
                    "POST", _object_path(elasticgpu.EGPU_PLURAL, "", ""),
                    body=msgspec.json.encode(request.obj)))
                return slim_elasticgpu(created)

    async def _get_optional(self, path: str) -> dict[str, Any] | None:
        try:
            raw = await self.client.request("GET", path)
        except ApiStatusError as err:
            if err.code != 404:
                raise
            return None
        decoded: dict[str, Any] = msgspec.json.decode(raw)
        return decoded


class _Page(msgspec.Struct):
    metadata: dict[str, Any] = {}


def _version(text: object) -> int | None:
    """A resourceVersion as a number (etcd's revision), None if it is not one."""
    try:
        return int(str(text))
    except ValueError:
        return None


def _feed(feed: str) -> str:
    if feed not in FEEDS:
        raise ValueError(f"no feed {feed!r}")
    return feed


def _object_path(plural: str, namespace: str, name: str) -> str:
    resource = EGPU_RESOURCES.get(plural)
    if resource is None:
        raise ValueError(f"{plural!r} is not an Elastic GPU API resource")
    return resource.path(namespace or None, name or None)


async def _stdio() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                        sys.stdout.buffer)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer


async def run(kubeconfig: Path | None) -> int:
    client = RestClient.from_config(kubeconfig)
    reader, writer = await _stdio()
    worker = Worker(client, lambda message: writer.write(ipc.encode(message)))
    worker.start()
    try:
        await serve(reader, worker, writer.drain)
    finally:  # the scheduler closed our stdin: it is gone or stopping us
        await client.close()
    return 0


async def serve(reader: asyncio.StreamReader, worker: Worker,
                drain: Callable[[], Awaitable[None]]) -> None:
    """Handle the scheduler's requests, each in its own task, until the end of its stream;
    then stop the feeds and the requests in flight. A frame that is not a request is
    answered with an error (`Worker.refuse`) and the stream read on."""
    requests: set[asyncio.Task[None]] = set()
    try:
        while True:
            try:
                request = await ipc.read(reader, ipc.REQUESTS)
            except ipc.MessageError as err:
                worker.refuse(err)
                continue
            if request is None:
                return
            task = asyncio.create_task(worker.handle(request))
            requests.add(task)
            task.add_done_callback(requests.discard)
            await drain()
    finally:
        for task in {*worker.tasks.values(), *requests}:
            task.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, default=None)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, stream=sys.stderr,
                  fmt="%(asctime)s apiworker %(levelname)s %(message)s")
    gcpolicy.freeze_survivors()  # its change filter keeps a digest of every object
    try:
        return eventloop.run(run(args.kubeconfig))
    except ClientConfigError as err:
        print(f"apiworker: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
