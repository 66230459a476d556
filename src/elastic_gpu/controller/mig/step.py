"""What the two moving steps of a round (substitution, moving back) are built from: the
controller's context, the Node informer, the metrics, the round's shared state and its writes."""

from __future__ import annotations

from elastic_gpu.controller.config import MigConfig
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.mig.metrics import MigMetrics
from elastic_gpu.controller.mig.state import RoundState
from elastic_gpu.controller.mig.writes import AdapterWrites
from elastic_gpu.kube.informer import Informer


class MovingStep:
    """A step that moves pods: it reads the nodes and the round's state, and writes only
    through `writes` (each write with its Event)."""

    def __init__(self, ctx: Context, nodes: Informer, metrics: MigMetrics, state: RoundState,
                 writes: AdapterWrites) -> None:
        self.client = ctx.client
        self.recorder = ctx.recorder
        self.config: MigConfig = ctx.config.mig
        self.nodes = nodes
        self.metrics = metrics
        self.state = state
        self.writes = writes
