"""Placement: where a pod goes and which cards it gets, over nodes kept as arrays. Pure, no I/O.

`Engine` (engine.py) is the front the simulator and the scheduler extender drive; the modules
beside it each hold one part of its work (docs/architecture.md, "Placement inside the core").
"""

from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.placement.engine import (
    Engine,
    FilterResult,
    FreeCards,
    PolicyConfig,
    ScoredNodes,
)
from elastic_gpu.core.placement.task import task_shape

__all__ = ["Engine", "FilterResult", "FreeCards", "PolicyConfig", "ScoredNodes", "Unschedulable",
           "task_shape"]
