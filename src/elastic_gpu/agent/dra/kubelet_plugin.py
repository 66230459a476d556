"""The kubelet's DRA plugin of the driver `gpu.elasticgpu.io`: two gRPC servers on unix sockets.

- **Registration** (`<registryDirectory>/gpu.elasticgpu.io-reg.sock`, the plugin watcher's directory,
  `/var/lib/kubelet/plugins_registry/` by default): kubelet notices the socket, calls `GetInfo`
  (type `DRAPlugin`, the driver's name, the service socket's path, the services served:
  `v1.DRAPlugin`), then `NotifyRegistrationStatus`; a refusal is logged with kubelet's reason.
- **DRAPlugin v1** (`<pluginDirectory>/dra.sock`, `/var/lib/kubelet/plugins/gpu.elasticgpu.io/`),
  and on the same socket the device health stream (`health`, `v1alpha1.DRAResourceHealth`):
  `NodePrepareResources` reads each claim through the project's client stack, decides with
  `prepare.prepare_claim` (pure), refuses one that would put a card past its capacity beside
  the claims prepared here (`guard`), writes the claim's CDI spec (`cdi`) and records the answer
  in the checkpoint (`checkpoint`); `NodeUnprepareResources` removes both. A claim that cannot
  be prepared gets its own error string; the call and the other claims go on.

Threads, as the device plugins (`agent/plugin.py`): grpc's sync server runs each call on a pool
thread, and the Kubernetes client is the synchronous one.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from elastic_gpu.agent.config import DRA_SOCKET_NAMES
from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.agent.dra.cdi import remove_spec, spec_file, uid_problem, write_spec
from elastic_gpu.agent.dra.checkpoint import CHECKPOINT_FILE, Checkpoint
from elastic_gpu.agent.dra.guard import CapacityGuard
from elastic_gpu.agent.dra.health import DraHealthService
from elastic_gpu.agent.dra.prepare import (
    ClaimRef,
    GrantInputs,
    PreparedClaim,
    PrepareError,
    claim_group,
    prepare_claim,
    reserved_pods,
)
from elastic_gpu.agent.proto import (
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from elastic_gpu.agent.state import NodeState
from elastic_gpu.core.dra.devices import DRIVER
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import PODS, RESOURCE_CLAIMS
from elastic_gpu.kube.sync import SyncKubeClient

log = logging.getLogger(__name__)

#: PluginInfo.type of a DRA driver's plugin (kubelet's plugin watcher dispatches on it).
PLUGIN_TYPE = "DRAPlugin"
#: The services served, as kubelet 1.34+ names them ("<proto package tail>.<service>").
SUPPORTED_SERVICES = ("v1.DRAPlugin",)
SERVICE_SOCKET = DRA_SOCKET_NAMES["pluginDirectory"]
#: How often the sockets are checked (someone removed one: serve it again).
WATCH_TICK_S = 1.0

ClaimReader = Callable[[ClaimRef], Mapping[str, Any]]
#: (namespace, name) -> the pod, None when it does not exist
PodReader = Callable[[str, str], Mapping[str, Any] | None]


def registration_socket(registry_dir: Path) -> Path:
    """`<registryDirectory>/gpu.elasticgpu.io-reg.sock`: the plugin watcher's name for it."""
    return registry_dir / DRA_SOCKET_NAMES["registryDirectory"]


def api_claim_reader(client: SyncKubeClient) -> ClaimReader:
    def read(ref: ClaimRef) -> Mapping[str, Any]:
        return client.get(RESOURCE_CLAIMS.path(namespace=ref.namespace, name=ref.name))
    return read


def api_pod_reader(client: SyncKubeClient) -> PodReader:
    """A pod by a list of its name (the agent's role lists and watches pods; it gets none)."""
    def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        items, _ = client.list(PODS.path(namespace=namespace),
                               {"fieldSelector": f"metadata.name={name}"})
        return items[0] if items else None
    return read


class DraPlugin:
    """Prepare and unprepare claims: the decisions of `prepare`, the files of `cdi` and
    `checkpoint`. One lock: kubelet's calls for one claim never overlap, and a node prepares
    few claims at a time."""

    def __init__(self, node: str, read_claim: ClaimReader,
                 cards: Callable[[], Mapping[int, LogicalCard]], inputs: GrantInputs,
                 plugin_dir: Path, cdi_dir: Path, read_pod: PodReader | None = None) -> None:
        self.node = node
        self.read_claim = read_claim
        #: the claim's pod, for a container given several claims (`prepare.claim_group`)
        self.read_pod = read_pod
        self.cards = cards
        self.inputs = inputs
        self.cdi_dir = cdi_dir
        self.checkpoint = Checkpoint(plugin_dir / CHECKPOINT_FILE)
        self._lock = threading.Lock()
        #: claims prepared from the API (not answered from the checkpoint), for tests and logs
        self.prepared_from_api = 0
        #: the capacity check over the claims prepared here, and who hears of a refusal (the
        #: claim read from the API, the message): the node mode's Event on its pods
        self.guard = CapacityGuard(node, read_claim)
        self.on_refused: Callable[[Mapping[str, Any], str], None] | None = None

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        problem = uid_problem(ref.uid)
        if problem is not None:
            raise PrepareError(f"{ref.describe()}: {problem}")
        with self._lock:
            done = self.checkpoint.get(ref.uid)
            if done is not None:
                if not spec_file(self.cdi_dir, ref.uid).exists():
                    # the CDI directory is a tmpfs emptied by a reboot: the same spec again
                    write_spec(self.cdi_dir, ref.uid, done.spec)
                return done
            try:
                claim = self.read_claim(ref)
            except NotFound:
                raise PrepareError(f"{ref.describe()}: not found in the API") from None
            except Exception as err:
                raise PrepareError(f"{ref.describe()}: cannot read it: {err}") from None
            cards = self.cards()
            prepared = prepare_claim(claim, ref, self.node, cards, self.inputs,
                                     self._group(claim, ref))
            refused = self.guard.refusal(prepared, self.checkpoint.claims(),
                                         [lc.card for _, lc in sorted(cards.items())])
            if refused is not None:  # a card would be given past its capacity (`guard`)
                if self.on_refused is not None:
                    self.on_refused(claim, refused)
                raise PrepareError(refused)
            write_spec(self.cdi_dir, ref.uid, prepared.spec)
            self.checkpoint.put(prepared)
            self.prepared_from_api += 1
            log.info("prepared %s: %s", ref.describe(),
                     ", ".join(d.device for d in prepared.devices))
            return prepared

    def _group(self, claim: Mapping[str, Any], ref: ClaimRef
               ) -> list[tuple[str, Mapping[str, Any]]]:
        """The claims sharing this claim's grant (`prepare.claim_group`), read from the API;
        empty (the claim alone) when it is reserved for several pods or any read fails."""
        pods = reserved_pods(claim)
        if self.read_pod is None or len(pods) != 1:
            return []
        try:
            pod = self.read_pod(ref.namespace, pods[0][0])
            if pod is None or (pod.get("metadata") or {}).get("uid") != pods[0][1]:
                return []
            names = claim_group(pod, ref.name)
            if len(names) < 2:
                return []
            return [(name, claim if name == ref.name else
                     self.read_claim(ClaimRef(ref.namespace, name, "")))
                    for name in names]
        except Exception as err:  # the claim alone: what it was given, never more
            log.warning("%s: the claims beside it not read (%s); its own grant only",
                        ref.describe(), err)
            return []

    def unprepare(self, uid: str) -> None:
        """Raises ValueError for a uid that is no Kubernetes uid (nothing is removed)."""
        problem = uid_problem(uid)
        if problem is not None:
            raise ValueError(problem)
        with self._lock:
            removed = remove_spec(self.cdi_dir, uid)
            known = self.checkpoint.remove(uid)
            if removed or known:
                log.info("unprepared claim %s", uid)


def prepared_to_proto(prepared: PreparedClaim) -> dra_v1_pb2.NodePrepareResourceResponse:
    return dra_v1_pb2.NodePrepareResourceResponse(devices=[
        dra_v1_pb2.Device(request_names=list(d.requests), pool_name=d.pool,
                          device_name=d.device, cdi_device_ids=list(d.cdi_ids),
                          **({"share_id": d.share_id} if d.share_id is not None else {}))
        for d in prepared.devices])


class DraService(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def NodePrepareResources(self, request: dra_v1_pb2.NodePrepareResourcesRequest,
                             context: Any) -> dra_v1_pb2.NodePrepareResourcesResponse:
        answers = {}
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            try:
                answers[claim.uid] = prepared_to_proto(self.plugin.prepare(ref))
            except PrepareError as err:
                log.warning("NodePrepareResources refused: %s", err)
                answers[claim.uid] = dra_v1_pb2.NodePrepareResourceResponse(error=str(err))
            except Exception as err:  # a per-claim answer, never a failed call
                log.exception("NodePrepareResources: %s", ref.describe())
                answers[claim.uid] = dra_v1_pb2.NodePrepareResourceResponse(
                    error=f"{ref.describe()}: {type(err).__name__}: {err}")
        return dra_v1_pb2.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: dra_v1_pb2.NodeUnprepareResourcesRequest,
                               context: Any) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        answers = {}
        for claim in request.claims:
            try:
                self.plugin.unprepare(claim.uid)
                answers[claim.uid] = dra_v1_pb2.NodeUnprepareResourceResponse()
            except ValueError as err:
                log.warning("NodeUnprepareResources refused: %s", err)
                answers[claim.uid] = dra_v1_pb2.NodeUnprepareResourceResponse(error=str(err))
            except Exception as err:
                log.exception("NodeUnprepareResources: claim %s", claim.uid)
                answers[claim.uid] = dra_v1_pb2.NodeUnprepareResourceResponse(
                    error=f"claim {claim.uid}: {type(err).__name__}: {err}")
        return dra_v1_pb2.NodeUnprepareResourcesResponse(claims=answers)


class RegistrationService(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        #: kubelet's last word: None before it spoke, else (registered, error)
        self.status: tuple[bool, str] | None = None
        self.registered = threading.Event()
        #: Called (on a thread of its own) each time kubelet registers the plugin: a starting
        #: kubelet deletes every DRA ResourceSlice of its node, so they are published again.
        self.on_registered: Callable[[], None] | None = None

    def GetInfo(self, request: pluginregistration_v1_pb2.InfoRequest,
                context: Any) -> pluginregistration_v1_pb2.PluginInfo:
        return pluginregistration_v1_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_SERVICES))

    def NotifyRegistrationStatus(self, request: pluginregistration_v1_pb2.RegistrationStatus,
                                 context: Any
                                 ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        self.status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("kubelet registered the DRA plugin %s (%s)", DRIVER, self.endpoint)
            self.registered.set()
            if self.on_registered is not None:
                threading.Thread(target=self.on_registered, name="dra-registered",
                                 daemon=True).start()
        else:
            self.registered.clear()
            log.error("kubelet REFUSED the DRA plugin %s: %s (claims of this driver cannot "
                      "be prepared on this node until it is registered)", DRIVER,
                      request.error or "no reason given")
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class _Socket:
    """One gRPC server on one unix socket, served again when its socket file goes."""

    def __init__(self, path: Path, add: Callable[[Any], None], name: str) -> None:
        self.path = path
        self.add = add
        self.name = name
        self._server: Any = None
        self._inode: int | None = None

    def start(self) -> None:
        self.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # a stale socket of a previous run would refuse the bind
        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix=self.name))
        self.add(server)
        if server.add_insecure_port(f"unix://{self.path}") == 0:
            raise OSError(f"cannot listen on {self.path}")
        server.start()
        self._server = server
        self._inode = os.stat(self.path).st_ino

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
            if self.intact():  # ours: gone with the server, so kubelet sees the plugin go
                self.path.unlink()

    def intact(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            return False


class KubeletPluginServer:
    """The DRA service (with the device health stream when `state` is given) and its
    registration, served until `stop`."""

    def __init__(self, plugin: DraPlugin, plugin_dir: Path, registry_dir: Path,
                 state: NodeState | None = None) -> None:
        self.plugin = plugin
        self.service_socket = plugin_dir / SERVICE_SOCKET
        self.registration = RegistrationService(self.service_socket)
        self._streams_stop = threading.Event()
        service = DraService(plugin)
        health = (DraHealthService(plugin.node, state, self._streams_stop)
                  if state is not None else None)

        def add_services(server: Any) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(service, server)
            if health is not None:
                dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                    health, server)
        self._service = _Socket(self.service_socket, add_services, "dra")
        self._registry = _Socket(
            registration_socket(registry_dir),
            lambda s: pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(
                self.registration, s), "dra-reg")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def registration_socket(self) -> Path:
        return self._registry.path

    def start(self) -> None:
        # the service first: when kubelet sees the registration socket, the endpoint it is
        # told of already answers
        self._streams_stop.clear()
        self._service.start()
        self._registry.start()
        log.info("DRA plugin %s: service %s, registration %s", DRIVER, self._service.path,
                 self._registry.path)
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="dra-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_TICK_S):
            for sock in (self._service, self._registry):
                if not sock.intact():
                    log.warning("socket %s is gone: serving it again", sock.path)
                    try:
                        sock.start()
                    except Exception:
                        log.exception("serving %s again", sock.path)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._streams_stop.set()  # health streams end at their next tick
        # the registration first, so kubelet stops calling a service about to go
        self._registry.stop()
        self._service.stop()
