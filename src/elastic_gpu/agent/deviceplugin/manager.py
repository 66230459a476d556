"""All plugins of the node: serve, register, and survive kubelet restarts.

A kubelet restart removes every socket in the device-plugin directory and creates a new
kubelet.sock. Every `WATCH_TICK_S` the manager checks each plugin's socket (by inode, so a
socket re-created by someone else is noticed too) and kubelet.sock's inode; a missing socket
means: stop that server, serve again, register again; a new kubelet.sock means: register
again. A failed registration (kubelet not up yet) is retried on the next tick. With a 0.1 s
tick, re-registration after a wipe takes well under the 2 s kubelet tolerates.

A MIG layout change (`update`) re-serves only the resources whose devices changed: the
`nvidia.com/mig-<profile>` plugins a step touched and the whole-card one; kubelet sees the
others' streams untouched.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc

from elastic_gpu.agent.deviceplugin.plugin import KUBELET_SOCKET, PluginServer

log = logging.getLogger(__name__)

WATCH_TICK_S = 0.1


class PluginManager:
    def __init__(self, servers: Sequence[PluginServer], plugin_dir: Path) -> None:
        self.servers = list(servers)
        self.plugin_dir = plugin_dir
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kubelet_inode: int | None = None
        self.restarts = 0
        #: held by a tick and by `update`: a tick never restarts a server `update` stopped
        self._lock = threading.RLock()

    def _kubelet_inode_now(self) -> int | None:
        try:
            return os.stat(self.plugin_dir / KUBELET_SOCKET).st_ino
        except FileNotFoundError:
            return None

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self.tick()
        self._thread = threading.Thread(target=self._loop, name="plugin-watch", daemon=True)
        self._thread.start()

    def update(self, servers: Sequence[PluginServer]) -> list[str]:
        """Serve `servers` (the node's plans now) in place of the running ones: a running
        server whose plan is the same keeps serving; one whose devices changed, or whose
        resource is gone, is stopped; a changed or new one is served (and registered by the
        tick). The resources started or stopped, sorted."""
        with self._lock:
            running = {server.resource: server for server in self.servers}
            kept: list[PluginServer] = []
            changed: list[str] = []
            for server in servers:
                old = running.pop(server.resource, None)
                if old is not None and old.plan == server.plan:
                    kept.append(old)
                    continue
                if old is not None:
                    old.stop()
                if self._thread is not None:
                    server.start()
                kept.append(server)
                changed.append(server.resource)
            for gone in running.values():
                gone.stop()
                changed.append(gone.resource)
            self.servers = kept
            if self._thread is not None:
                self.tick()
        return sorted(changed)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for server in self.servers:
            server.stop()

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_TICK_S):
            try:
                self.tick()
            except Exception:  # the watch must outlive any one bad tick
                log.exception("device plugin watch")

    def tick(self) -> None:
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        for server in self.servers:
            if not server.socket_intact():
                log.warning("socket of %s is gone (kubelet restart?): serving again",
                            server.resource)
                server.start()
                self.restarts += 1
        inode = self._kubelet_inode_now()
        if inode is None:
            return  # no kubelet yet; register when it appears
        if inode != self._kubelet_inode:
            self._kubelet_inode = inode
            for server in self.servers:
                server.registered = False
        for server in self.servers:
            if not server.registered:
                try:
                    server.register()
                except grpc.RpcError as err:
                    log.warning("registering %s failed (will retry): %s", server.resource,
                                err.details() if hasattr(err, "details") else err)
