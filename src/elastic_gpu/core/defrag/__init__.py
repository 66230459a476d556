"""Defragmentation: which placed pods to move so that a pending pod fits. Pure, no I/O.

`plan_moves` (plan.py) searches the fewest moves over the engine's state with the engine's own
fit and scoring; `candidates` ranks the nodes and move sets it tries. The simulator
(`egpu simulate --defrag-moves`) and the defragmentation controller call the same function.
"""

from elastic_gpu.core.defrag.plan import DefragPlan, Move, plan_moves

__all__ = ["DefragPlan", "Move", "plan_moves"]
