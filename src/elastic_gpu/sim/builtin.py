"""The built-in cluster and workload: `egpu simulate` without --nodes/--pods.

Both are generated in code (no trace data is shipped). The cluster has the model mix and node
sizes of a production GPU-sharing cluster of about 1,200 GPU nodes and 6,200 GPUs (eight-GPU
nodes dominate, then two-GPU inference nodes); the workload has a production-like mix by count:
about 13% CPU-only tasks, 38% shares of one GPU, 48% one whole GPU and 1% on 2, 4 or 8 GPUs, with
CPU and memory requests that grow with the GPU request. The workload is drawn with a fixed seed,
so it is the same for every --seed (which, as in the FGD protocol, only shuffles and resamples).
"""

from __future__ import annotations

import numpy as np

from elastic_gpu.core.model import Node
from elastic_gpu.sim.trace import Task, make_node

#: (model, GPUs, CPU milli, memory MiB, count)
NODE_TYPES: tuple[tuple[str, int, int, int, int], ...] = (
    ("G2", 8, 96_000, 393_216, 550),
    ("T4", 2, 104_000, 524_288, 385),
    ("P100", 2, 16_000, 122_880, 110),
    ("G3", 8, 128_000, 786_432, 40),
    ("V100M16", 4, 32_000, 131_072, 28),
    ("P100", 2, 64_000, 262_144, 22),
    ("V100M32", 8, 96_000, 786_432, 20),
    ("V100M16", 1, 8_000, 32_768, 20),
    ("T4", 4, 96_000, 393_216, 17),
    ("V100M32", 4, 48_000, 376_832, 9),
    ("V100M16", 8, 64_000, 262_144, 8),
    ("P100", 1, 8_000, 61_440, 4),
)

#: share sizes (milli) and their relative frequency among GPU-sharing tasks
SHARE_SIZES = ((810, 0.22), (470, 0.14), (320, 0.12), (650, 0.10), (500, 0.09), (250, 0.08),
               (200, 0.07), (100, 0.06), (400, 0.06), (50, 0.06))

WORKLOAD_SEED = 2023
WORKLOAD_TASKS = 8000


def builtin_nodes() -> list[Node]:
    nodes: list[Node] = []
    for model, gpus, cpu, mem, count in NODE_TYPES:
        for _ in range(count):
            nodes.append(make_node(f"node-{len(nodes):04d}", cpu, mem, gpus, model))
    return nodes


def builtin_tasks(count: int = WORKLOAD_TASKS, seed: int = WORKLOAD_SEED) -> list[Task]:
    rng = np.random.default_rng(seed)
    sizes = np.array([s for s, _ in SHARE_SIZES])
    size_p = np.array([p for _, p in SHARE_SIZES])
    size_p /= size_p.sum()
    kinds = rng.choice(4, size=count, p=[0.133, 0.378, 0.480, 0.009])
    cpu_steps = np.array([1000, 2000, 4000, 6000, 8000, 12000, 16000])
    tasks: list[Task] = []
    for i, kind in enumerate(kinds):
        name = f"task-{i:05d}"
        if kind == 0:  # CPU-only
            cpu = int(rng.choice(cpu_steps[:5]))
            tasks.append(Task(name, cpu, cpu * 2 + int(rng.integers(0, 4)) * 1024, 0, 0))
        elif kind == 1:  # a share of one GPU
            milli = int(rng.choice(sizes, p=size_p))
            cpu = int(rng.choice(cpu_steps[:5], p=[0.15, 0.25, 0.3, 0.2, 0.1]))
            tasks.append(Task(name, cpu, cpu * 2 + 4096, 1, milli))
        elif kind == 2:  # one whole GPU
            cpu = int(rng.choice(cpu_steps[2:], p=[0.25, 0.3, 0.2, 0.15, 0.1]))
            tasks.append(Task(name, cpu, cpu * 2 + 8192, 1, 1000))
        else:  # 2, 4 or 8 whole GPUs
            gpus = int(rng.choice([2, 4, 8], p=[0.3, 0.25, 0.45]))
            cpu = gpus * int(rng.choice([4000, 6000, 8000]))
            tasks.append(Task(name, cpu, cpu * 2 + 16384, gpus, 1000))
    return tasks
