"""The defragmentation controller (`defrag` in `egpu controller`, issue 30; docs/defrag.md).

Off by default (`defrag.enabled` in `--config`). Each round:
1. waits while the last plan it carried out settles (its pending pod bound, gone, or
   `settleSeconds` passed): one plan in flight at a time, so a plan is never made over pods
   already being evicted;
2. finds pods waiting for GPU capacity (kube-scheduler's Unschedulable) in the namespaces it
   governs, most important then oldest first, that the Engine cannot place as things are;
3. reads the cluster into an Engine as the extender counts it (`cluster.py`), keeps the pods
   that may move (`core.defrag.movable`), and asks the planner (`core.defrag.plan.plan_moves`,
   the simulator's) for the fewest moves that make room, each move checked placeable;
4. report mode: an Event with the plan on the pending pod (and a log line); move mode: the
   rate limits (`core.defrag.limits`), then the evictions (`writes.py`: policy/v1, so
   PodDisruptionBudgets hold; a 429 is recorded, never retried in a loop).
"""
