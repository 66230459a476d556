"""The state's one set of fields and its lock, shared by its parts (inventory, holds, claims,
reservations, wake-ups, placement), each a class over this base; `SchedulerState` is all of
them. The fields stay on one object and every public method takes the one `_lock`, as before
the split: splitting the code must not split the lock (a filter sees every earlier reservation).

The abstract methods at the end are the calls one part makes into another: listed here so that
each part type-checks alone and a reader sees every seam between them in one place.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.core.claims.inventory import ledger_key
from elastic_gpu.core.claims.model import Claim, GPUClass
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, FilterResult, PolicyConfig, ScoredNodes
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.wakeup import Waiter, Wake
from elastic_gpu.core.workload import TargetWorkload, TaskShape
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.state.records import NodeInfo, PodInfo, Reservation, StateNotReady

#: Prefix of ElasticGPU ledger keys (`core.claims.ledger_key`); never a pod UID.
EGPU_KEY = ledger_key("")
#: The feeds of the Elastic GPU API (their CRDs missing = none exist, `apiworker`).
CLAIM_SOURCES = frozenset({"elasticgpus", "elasticgpuclaims", "elasticgpuclasses"})


class StateBase:
    """The fields of `SchedulerState`, its readiness, and the calls across its parts."""

    def __init__(self, config: SchedulerConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.config = config or SchedulerConfig()
        self._clock = clock
        #: the wall clock, for the expiry of defragmentation reservations (absolute times
        #: another process wrote: `core.defrag.reservation`)
        self._wall = wall_clock
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeInfo] = {}
        self._devices: dict[str, tuple[str, Card]] = {}  # device object name -> (node, card)
        self._node_devices: dict[str, set[str]] = {}
        #: nodes serving GPUs through DRA (`core.dra.nodemode`): kube-scheduler allocates
        #: their devices; the engine never sees cards there
        self._dra_nodes: set[str] = set()
        self._dirty: set[str] = set()
        self._pods: dict[str, PodInfo] = {}  # uid -> latest version seen
        self._gone: OrderedDict[str, None] = OrderedDict()  # uids seen deleted, newest last
        self._inflight: dict[str, dict[int, Reservation]] = {}  # uid -> token -> reservation
        self._tokens = 0
        self._holds: dict[str, Assignment] = {}  # uid -> what the engine has allocated
        self._node_pods: dict[str, set[str]] = {}  # node -> uids holding cards there
        self._conflicts: dict[str, str] = {}  # uid -> why its annotation could not be counted
        #: uid -> expiry (wall clock) of the defragmentation reservation it holds (a pending
        #: pod: its `_holds` entry is the reservation's cards)
        self._reserved_until: dict[str, float] = {}
        #: uid -> why its assignment is not the scheduler's (not counted; logged once)
        self._distrusted: dict[str, str] = {}
        #: CPU and memory of bound pods, for the policies' view of a node (not for fit:
        #: kube-scheduler filters on those before it asks us)
        self._host_of: dict[str, tuple[str, int, int]] = {}  # uid -> (node, CPU milli, MiB)
        #: the same for binds in flight, per reservation (the pod is not bound yet)
        self._host_reserved: dict[tuple[str, int], tuple[str, int, int]] = {}
        self._host_total: dict[str, tuple[int, int]] = {}  # node -> (CPU milli, MiB)
        #: targetWorkload "observed": the shape of every live pod, and how many pods came or
        #: went since the engine's workload was last rebuilt from them
        self._shapes: dict[str, TaskShape] = {}
        self._shape_counts: Counter[TaskShape] = Counter()
        self._shape_changes = 0
        self.workload: TargetWorkload | None = None  # None: the built-in default
        self.engine = self._new_engine(())
        self._known: frozenset[str] = frozenset()
        #: bumped by every change of the engine's allocations or inventory
        self._version = 0
        self._last_scores: tuple[str, PodRequest, int, ScoredNodes] | None = None
        self._synced: set[str] = set()
        #: Waking pending pods (`core.wakeup`): the pods the filter turned away for GPU reasons,
        #: the nodes whose capacity freed since (node -> epoch of the latest freeing), and the
        #: counter that orders the two. Freeings are recorded only while some pod waits.
        self._waiting: dict[str, Waiter] = {}
        self._freed: dict[str, int] = {}
        self._epoch = 0
        self.wakeup_counts: Counter[str] = Counter()
        #: The Elastic GPU API as the watches show it (core types), and ElasticGPU object
        #: UIDs seen deleted (a create's answer arriving after the deletion stays gone).
        self._egpus: dict[str, claims_model.ElasticGPU] = {}
        self._egpu_uids: dict[str, str] = {}
        self._egpus_gone: OrderedDict[str, None] = OrderedDict()
        self._claims: dict[tuple[str, str], Claim] = {}
        self._classes: dict[str, GPUClass] = {}
        #: ElasticGPU name -> uids of the pods whose assignment uses its cards: they hold
        #: those cards themselves while it is not counted (`_egpu_counted`)
        self._egpu_consumers: dict[str, set[str]] = {}
        #: pods the filter turned away because a claim they name is not bound (uid -> (pod
        #: namespace, name, the claims it waits for)), and those to wake now that one is
        self._claim_waiting: dict[str, tuple[str, str, frozenset[str]]] = {}
        self._claim_wakes: dict[str, Wake] = {}
        self.required_sources: frozenset[str] = frozenset({"nodes", "pods", "gpudevices"}) \
            | CLAIM_SOURCES

    # ---- readiness --------------------------------------------------------------------------

    def mark_synced(self, source: str) -> None:
        with self._lock:
            self._synced.add(source)
            self._flush()

    @property
    def ready(self) -> bool:
        return self.required_sources <= self._synced

    def not_ready_reason(self) -> str:
        missing = ", ".join(sorted(self.required_sources - self._synced))
        return f"the Elastic GPU scheduler has not synced its caches yet ({missing}); retry shortly"

    def require_ready(self) -> None:
        if not self.ready:
            raise StateNotReady(self.not_ready_reason())

    def _new_engine(self, nodes: Iterable[Node]) -> Engine:
        policy = PolicyConfig(node_policy=self.config.node_policy,
                              card_policy=self.config.card_policy,
                              check_host_resources=False,
                              load_aware=self.config.load_aware)
        return Engine(nodes, config=policy, seed=self.config.seed, workload=self.workload)

    # ---- calls across parts (each defined by the part named) --------------------------------

    @abstractmethod
    def _flush(self) -> None: ...  # inventory

    @abstractmethod
    def _sync(self, uid: str) -> None: ...  # holds

    @abstractmethod
    def _set_hold(self, uid: str, assignment: Assignment | None) -> None: ...  # holds

    @abstractmethod
    def _sync_consumers(self, name: str) -> None: ...  # holds

    @abstractmethod
    def _index_consumer(self, uid: str, old: PodInfo | None, new: PodInfo | None
                        ) -> None: ...  # holds

    @abstractmethod
    def _add_host(self, node: str, cpu: int, mem: int, sign: int) -> None: ...  # holds

    @abstractmethod
    def _count_host(self, uid: str) -> None: ...  # holds

    @abstractmethod
    def _refresh_workload(self) -> None: ...  # holds

    @abstractmethod
    def _reservation_key(self, uid: str, token: int) -> str: ...  # reservations

    @abstractmethod
    def _allocate_reservation(self, uid: str, token: int, assignment: Assignment
                              ) -> None: ...  # reservations

    @abstractmethod
    def _drop_reservations(self, uid: str, token: int | None = None) -> None: ...  # reservations

    @abstractmethod
    def _reserve_assignment(self, pod: PodRequest, uid: str, node: str,
                            assignment: Assignment) -> int: ...  # reservations

    @abstractmethod
    def expire(self) -> int: ...  # reservations

    @abstractmethod
    def _defrag_hold_released(self, uid: str) -> AbstractContextManager[None]: ...  # reservations

    @abstractmethod
    def _mark_freed(self, node: str) -> None: ...  # wakeups

    @abstractmethod
    def _note_filtered(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                       feasible: Sequence[str]) -> None: ...  # wakeups

    @abstractmethod
    def _prepare(self) -> None: ...  # placement

    @abstractmethod
    def filter(self, pod: PodRequest, uid: str, node_names: Sequence[str]
               ) -> FilterResult: ...  # placement

    @abstractmethod
    def _priority_of(self, pod: PodRequest, uid: str) -> int: ...  # placement
