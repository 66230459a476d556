"""How many pods of a namespace are bound (and Running), counted from a protobuf watch instead
of polling.

Polling the unbound pods (a LIST every 0.1 s) costs kube-apiserver CPU per second, not per
pod: it serialised up to every unbound pod ten times a second, so a variant that binds more
slowly was charged more of the bench's own polls per pod, and the polls took CPU from what was
measured on a 2-core box. A watch costs per event instead, and in protobuf it costs nearly
nothing more: kube-apiserver serialises each watch event once per encoding, and kube-scheduler
already watches every pod in protobuf, so this watcher reuses those bytes in every variant.

Only the few fields needed are read, straight from the wire format (no generated code): the
stream is length-prefixed `WatchEvent` frames (type = 1, object = 2, a RawExtension whose raw
= 1 holds "k8s\\0" + `runtime.Unknown`, whose raw = 2 is the Pod); Pod: metadata = 1
(ObjectMeta.name = 1, resourceVersion = 6), spec = 2 (PodSpec.nodeName = 10), status = 3
(PodStatus.phase = 1), as in k8s.io/api/core/v1/generated.proto. An ERROR event (410 Gone)
carries a Status instead.
"""

from __future__ import annotations

import http.client
import multiprocessing
import ssl
import struct
import sys
from collections.abc import Iterator
from multiprocessing.sharedctypes import Synchronized
from urllib.parse import urlsplit

MAGIC = b"k8s\x00"


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) of one protobuf message: bytes for length-delimited fields, the
    integer for varints; fixed-width fields are skipped."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            size, at = _varint(data, at)
            yield number, data[at:at + size]
            at += size
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not expected here")


def first(data: bytes, number: int) -> bytes:
    for n, value in fields(data):
        if n == number and isinstance(value, bytes):
            return value
    return b""


def pod_of_event(frame: bytes) -> tuple[str, str, str, str, str]:
    """(event type, pod name, node name, resourceVersion, phase) of one WatchEvent frame."""
    kind = first(frame, 1).decode()
    raw = first(first(frame, 2), 1)
    if not raw.startswith(MAGIC):
        return kind, "", "", "", ""  # not an object
    pod = first(raw[len(MAGIC):], 2)
    meta = first(pod, 1)
    node = first(first(pod, 2), 10).decode()
    phase = first(first(pod, 3), 1).decode()
    return kind, first(meta, 1).decode(), node, first(meta, 6).decode(), phase


class _Watch:
    """The watch loop, in the counting process: ends only when that process is stopped."""

    def __init__(self, host: str, port: int | None, tls: ssl.SSLContext, path: str,
                 bound: Synchronized[int], running: Synchronized[int],
                 restarts: Synchronized[int], failed: Synchronized[int]) -> None:
        self._host, self._port, self._tls, self._path = host, port, tls, path
        self._bound, self._running = bound, running
        self._restarts, self._failed = restarts, failed
        self._names: set[str] = set()
        self._running_names: set[str] = set()
        self._version = ""

    def _open(self) -> http.client.HTTPResponse:
        conn = http.client.HTTPSConnection(self._host, self._port, context=self._tls,
                                           timeout=None)
        # resumed where it ended: started again from nothing, kube-apiserver would send every
        # pod of the namespace once more (and a 410 Gone ends this watch, which then does)
        since = f"&resourceVersion={self._version}" if self._version else ""
        conn.request("GET", self._path + since,
                     headers={"Accept": "application/vnd.kubernetes.protobuf;stream=watch"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"GET {self._path}: HTTP {response.status}")
        return response

    def run(self) -> None:
        while True:
            try:
                response = self._open()
            except (OSError, RuntimeError, http.client.HTTPException) as err:
                print(f"bind counter: {err}", file=sys.stderr, flush=True)
                self._failed.value = 1
                return
            try:
                self._read_frames(response)
                why = "the stream ended"
            except (OSError, ValueError, http.client.HTTPException) as err:
                why = repr(err)
            response.close()
            self._restarts.value += 1
            print(f"bind counter: {why}; watching again", file=sys.stderr, flush=True)

    def _read_frames(self, response: http.client.HTTPResponse) -> None:
        """Until the stream ends: frames are a 4-byte big-endian length and a WatchEvent."""
        buffer = bytearray()
        while True:
            data = response.read1(1 << 16)
            if not data:
                return
            buffer += data
            at = 0
            while len(buffer) - at >= 4:
                (size,) = struct.unpack_from(">I", buffer, at)
                if len(buffer) - at - 4 < size:
                    break
                kind, name, node, version, phase = pod_of_event(
                    bytes(buffer[at + 4:at + 4 + size]))
                at += 4 + size
                if kind == "ERROR":  # 410 Gone: the version is too old; start from nothing
                    self._version = ""
                    return
                self._version = version or self._version
                if node and kind in ("ADDED", "MODIFIED") and name not in self._names:
                    self._names.add(name)
                    self._bound.value = len(self._names)
                if phase == "Running" and kind in ("ADDED", "MODIFIED") \
                        and name not in self._running_names:
                    self._running_names.add(name)
                    self._running.value = len(self._running_names)
            del buffer[:at]


class BindCounter:
    """Counts the pods of `namespace` bound to a node, from a watch started at construction.

    The watch runs in a child process of its own: in a thread, the bench's other work (its CPU
    probe walks /proc) held the GIL long enough for kube-apiserver to drop the watch as
    unresponsive in a burst of binds, and a reader a process of its own still falls behind on a
    loaded 2-core box. An ended watch is simply started again, and the count is a set of
    names, so nothing is counted twice; it resumes from the last event's
    resourceVersion, so kube-apiserver does not send every pod again."""

    def __init__(self, server: str, tls: ssl.SSLContext, namespace: str) -> None:
        url = urlsplit(server)
        context = multiprocessing.get_context("fork")  # the TLS context is inherited, not pickled
        self._bound = context.Value("i", 0)
        self._running = context.Value("i", 0)
        self._restarts = context.Value("i", 0)
        self._failed = context.Value("i", 0)
        watch = _Watch(url.hostname or "127.0.0.1", url.port, tls,
                       f"/api/v1/namespaces/{namespace}/pods?watch=1",
                       self._bound, self._running, self._restarts, self._failed)
        self._process = context.Process(target=watch.run, name=f"bind-counter-{namespace}",
                                        daemon=True)
        self._process.start()

    @property
    def bound(self) -> int:
        return int(self._bound.value)

    @property
    def running(self) -> int:
        """Pods seen in phase Running (kwok marks bound pods Running at its own pace)."""
        return int(self._running.value)

    @property
    def restarts(self) -> int:
        """How often kube-apiserver ended the watch and it was started again."""
        return int(self._restarts.value)

    @property
    def failed(self) -> bool:
        """Whether the watch could not be (re)started (the reason is on stderr)."""
        return bool(self._failed.value) or not self._process.is_alive()

    def stop(self) -> None:
        self._process.terminate()
        self._process.join(timeout=5)
