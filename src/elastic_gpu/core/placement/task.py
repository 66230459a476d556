"""A pod reduced to the shape node policies score (and score caches are keyed by)."""

from __future__ import annotations

from elastic_gpu.core.request import PodRequest, RequestKind
from elastic_gpu.core.resources import MILLI_PER_CARD
from elastic_gpu.core.workload import DEFAULT_CPU_REQUEST, TaskShape


def task_shape(pod: PodRequest) -> TaskShape:
    """A pod reduced to what node policies score: CPU (0 counts as 100, like kube-scheduler),
    compute per card, number of cards, accepted models, host memory. Several GPU containers add
    up their cards at the largest per-card compute; MIG requests score as CPU-only."""
    cpu = pod.cpu_milli if pod.cpu_milli > 0 else DEFAULT_CPU_REQUEST
    models = pod.allowed_models or frozenset()
    gpu = [c for c in pod.gpu_containers if c.kind in (RequestKind.SHARE, RequestKind.WHOLE)]
    if not gpu:
        return TaskShape(cpu, 0, 0, models, pod.memory_mib)
    count = sum(c.cards for c in gpu)
    milli = max(c.compute_milli for c in gpu)
    if count > 1 or any(c.kind is RequestKind.WHOLE for c in gpu):
        milli = MILLI_PER_CARD if all(c.kind is RequestKind.WHOLE for c in gpu) else milli
    return TaskShape(cpu, milli, count, models, pod.memory_mib)
