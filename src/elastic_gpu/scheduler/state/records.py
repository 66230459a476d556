"""What the extender keeps of a Node and of a Pod (one version of each), read once from the
manifest the watch or a bind delivered; and the record of one bind in flight."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core import podlife
from elastic_gpu.core.assignment import Assignment, AssignmentError, distrust
from elastic_gpu.core.defrag.reservation import DefragReservation, ReservationError
from elastic_gpu.core.nodeaffinity import Taint
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest


@dataclass(frozen=True)
class NodeInfo:
    """What the extender needs from a Kubernetes Node."""

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    #: GPU resources in its capacity (name -> count); None: not known (node-level vendor
    #: check off). Cards' own `offers` (GPUDevice spec.resources) are checked within these.
    offers: Mapping[str, int] | None = None
    #: for the bind's placement check (`core.nodeaffinity`)
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class PodInfo:
    """What the extender needs from a Kubernetes Pod (one version of it)."""

    uid: str
    namespace: str
    name: str
    node_name: str
    phase: str
    resource_version: int | None
    priority: int
    assignment: Assignment | None
    #: Why the assignment annotation could not be read, if it could not.
    assignment_error: str | None
    manifest: Mapping[str, Any]
    #: no container of it runs or will run again (`core.podlife.stopped`): a terminal phase,
    #: or deleted with its containers terminated, whatever finalizer keeps the object
    stopped: bool = False
    #: `elasticgpu.io/assigned-node`, which the Binding writes with the assignment
    assigned_node: str | None = None
    #: `elasticgpu.io/defrag-reservation`: cards the defragmentation controller freed for it
    reservation: DefragReservation | None = None
    reservation_error: str | None = None
    #: `request()`, once read (a version's requests never change: filter and bind share it)
    _request: list[PodRequest] = field(default_factory=list, init=False, compare=False,
                                       repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def distrusted(self) -> str | None:
        """Why the pod's assignment is not the scheduler's (`core.assignment.distrust`: not
        bound, or bound elsewhere than it names), None when it is or there is none."""
        if self.assignment is None:
            return None
        return distrust(self.node_name, self.assigned_node, self.assignment)

    @property
    def holds(self) -> Assignment | None:
        """The cards this version of the pod holds according to the API, every ElasticGPU it
        names counted under its own key."""
        return self.held(lambda _egpu: True)

    def held(self, counted: Callable[[str], bool]) -> Assignment | None:
        """The cards this version of the pod holds itself while it has not stopped: its
        assignment less the claim-backed containers whose ElasticGPU the ledger counts
        (`counted`); one whose ElasticGPU is gone stays the pod's until the pod stops. Only an
        assignment the scheduler's Binding wrote holds anything (docs/architecture.md, "Who
        writes the ledger")."""
        if self.stopped or self.assignment is None:
            return None
        if self.distrusted is not None:
            return None  # not bound, or bound elsewhere than it names: not the Binding's
        return self.assignment.unclaimed(counted)

    def elasticgpus(self) -> frozenset[str]:
        """The ElasticGPUs whose cards its claim-backed containers use (none for an assignment
        the Binding did not write)."""
        if self.assignment is None or self.distrusted is not None:
            return frozenset()
        return frozenset(self.assignment.claims.values())

    def counts_as(self, other: PodInfo) -> bool:
        """Whether this version of a bound pod counts exactly as `other` does: the same node,
        annotations (assignment, assigned node, defragmentation reservation, policies), spec
        (requests) and stop. Only the record is newer, such as the watch's event of the Binding
        a bind already settled, or a status update of a running pod: nothing it holds moves."""
        if not self.node_name or self.node_name != other.node_name \
                or self.stopped != other.stopped \
                or (self.phase in podlife.TERMINAL_PHASES) != (other.phase in podlife.TERMINAL_PHASES):
            return False
        mine: Mapping[str, Any] = self.manifest.get("metadata") or {}
        theirs: Mapping[str, Any] = other.manifest.get("metadata") or {}
        return (mine.get("annotations") == theirs.get("annotations")
                and self.manifest.get("spec") == other.manifest.get("spec"))

    def request(self) -> PodRequest:
        """The pod's request, read from the manifest once per record (`replace` makes a new
        record, which reads it again)."""
        if not self._request:
            self._request.append(pod_request_from_manifest(self.manifest))
        return self._request[0]

    @staticmethod
    def from_manifest(pod: Mapping[str, Any]) -> PodInfo:
        meta: Mapping[str, Any] = pod.get("metadata") or {}
        spec: Mapping[str, Any] = pod.get("spec") or {}
        status: Mapping[str, Any] = pod.get("status") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        assignment: Assignment | None = None
        error: str | None = None
        text = annotations.get(ann.ASSIGNMENT)
        if text:
            try:
                assignment = Assignment.from_json(text)
            except AssignmentError as err:
                error = str(err)
        reservation: DefragReservation | None = None
        reservation_error: str | None = None
        reserved = annotations.get(ann.DEFRAG_RESERVATION)
        if reserved:
            try:
                reservation = DefragReservation.from_json(reserved)
            except ReservationError as err:
                reservation_error = str(err)
        rv_text = meta.get("resourceVersion")
        try:
            rv = int(rv_text) if rv_text is not None else None
        except (TypeError, ValueError):
            rv = None
        priority = spec.get("priority")
        return PodInfo(
            uid=str(meta.get("uid") or ""),
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            node_name=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or ""),
            resource_version=rv,
            priority=priority if isinstance(priority, int) else 0,
            assignment=assignment,
            assignment_error=error,
            manifest=pod,
            stopped=podlife.stopped(pod),
            assigned_node=annotations.get(ann.ASSIGNED_NODE),
            reservation=reservation,
            reservation_error=reservation_error,
        )


@dataclass
class Reservation:
    assignment: Assignment
    #: monotonic time after which it is dropped; infinite while its bind is still running
    deadline: float = float("inf")


class StateNotReady(RuntimeError):
    """Caches not synced yet: any answer would be a guess."""
