"""Reading the Alibaba GPU trace (cluster-trace-gpu-v2023, "openb") into engine objects.

Node list columns: sn, cpu_milli, memory_mib, gpu, model. Pod list columns: name, cpu_milli,
memory_mib, num_gpu, gpu_milli, and optionally gpu_spec (accepted models, `A|B`) and the rest,
which the replay does not use. Only GPU nodes are kept (the FGD protocol).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import ContainerRequest, PodRequest, parse_model_list
from elastic_gpu.core.resources import MILLI_PER_CARD
from elastic_gpu.core.workload import TaskShape

#: Card memory by model (MiB), as the FGD artifact lists them; the trace's undisclosed models
#: (G1-G3) get 32 GiB. Trace tasks ask for no card memory, so this only fills the inventory.
CARD_MEMORY_MIB = {
    "P4": 7611, "T4": 15109, "V100M16": 16160, "P100": 16280, "A10": 22731,
    "V100M32": 32510, "A100": 81251, "G1": 32768, "G2": 32768, "G3": 32768,
}
DEFAULT_CARD_MEMORY_MIB = 32768

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, row and column."""


@dataclass(frozen=True)
class Task:
    """One trace task."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str = ""

    @property
    def total_milli(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0

    def renamed(self, name: str) -> Task:
        return Task(name, self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_spec)

    def shape(self) -> TaskShape:
        models = parse_model_list(self.gpu_spec) or frozenset()
        if self.num_gpu == 0 or self.gpu_milli == 0:
            return TaskShape(self.cpu_milli, 0, 0, models, self.memory_mib)
        return TaskShape(self.cpu_milli, self.gpu_milli, self.num_gpu, models, self.memory_mib)

    def request(self) -> PodRequest:
        if self.num_gpu == 0 or self.gpu_milli == 0:
            containers: tuple[ContainerRequest, ...] = (ContainerRequest("main"),)
        elif self.gpu_milli < MILLI_PER_CARD:
            # a share of one card, or of each of num_gpu cards (`with_multi_shares`)
            containers = (ContainerRequest.share("main", self.gpu_milli, 0, self.num_gpu),)
        else:
            containers = (ContainerRequest.whole("main", self.num_gpu),)
        return PodRequest(self.name, namespace="trace", containers=containers,
                          cpu_milli=self.cpu_milli, memory_mib=self.memory_mib,
                          allowed_models=parse_model_list(self.gpu_spec))


#: The seed that picks which share tasks become multi-card shares: fixed, so every --seed
#: replays the same tasks (as the built-in workload is drawn once).
MULTI_SHARE_SEED = 40


def with_multi_shares(tasks: Sequence[Task], fraction: float, cards: int) -> list[Task]:
    """The trace with `fraction` of its one-card share tasks (below one card, chosen at random
    with `MULTI_SHARE_SEED`) asking that share on each of `cards` distinct cards: the public
    traces have no multi-card share (issue 40), so the simulator injects them. Fraction 0: the
    tasks unchanged."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"the multi-share fraction must be in [0, 1], got {fraction}")
    if cards < 2:
        raise ValueError(f"a multi-card share is on 2 cards or more, got {cards}")
    out = list(tasks)
    if fraction == 0.0:
        return out
    shares = sorted((i for i, t in enumerate(out)
                     if t.num_gpu == 1 and 0 < t.gpu_milli < MILLI_PER_CARD),
                    key=lambda i: out[i].name)
    rng = np.random.default_rng(MULTI_SHARE_SEED)
    for i in rng.choice(len(shares), size=round(fraction * len(shares)), replace=False).tolist():
        task = out[shares[i]]
        out[shares[i]] = dataclasses.replace(task, num_gpu=cards)
    return out


def make_node(name: str, cpu_milli: int, memory_mib: int, gpus: int, model: str) -> Node:
    memory = CARD_MEMORY_MIB.get(model, DEFAULT_CARD_MEMORY_MIB)
    cards = tuple(Card(i, f"GPU-{name}-{i}", model, memory) for i in range(gpus))
    return Node(name, cpu_milli, memory_mib, cards, {"elasticgpu.io/gpu-model": model})


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise TraceError(f"{path}: cannot open ({err.strerror})") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; "
                             f"expected at least {', '.join(required)}")
        yield from enumerate(reader, start=2)


def _int(path: Path, number: int, row: dict[str, str], column: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{number}: column {column}={text!r} is not a whole number") from None
    if value < 0:
        raise TraceError(f"{path}:{number}: column {column}={value} is negative")
    return value


def load_nodes(path: Path) -> list[Node]:
    """GPU nodes of a node list, in file order."""
    nodes: list[Node] = []
    for number, row in _rows(path, NODE_COLUMNS):
        gpus = _int(path, number, row, "gpu")
        if gpus == 0:
            continue
        model = (row.get("model") or "").strip()
        if not model:
            raise TraceError(f"{path}:{number}: a node with {gpus} GPUs needs a model")
        nodes.append(make_node(row["sn"].strip(), _int(path, number, row, "cpu_milli"),
                               _int(path, number, row, "memory_mib"), gpus, model))
    if not nodes:
        raise TraceError(f"{path}: no GPU nodes (every row has gpu=0)")
    return nodes


def load_tasks(path: Path) -> list[Task]:
    tasks: list[Task] = []
    for number, row in _rows(path, POD_COLUMNS):
        num_gpu = _int(path, number, row, "num_gpu")
        milli = _int(path, number, row, "gpu_milli")
        if num_gpu and not 0 < milli <= MILLI_PER_CARD:
            raise TraceError(f"{path}:{number}: gpu_milli={milli} must be 1-1000 with num_gpu={num_gpu}")
        if num_gpu > 1 and milli != MILLI_PER_CARD:
            raise TraceError(f"{path}:{number}: a task on {num_gpu} GPUs must take whole GPUs "
                             f"(gpu_milli=1000), got {milli}")
        tasks.append(Task(row["name"].strip(), _int(path, number, row, "cpu_milli"),
                          _int(path, number, row, "memory_mib"), num_gpu, milli if num_gpu else 0,
                          (row.get("gpu_spec") or "").strip()))
    if not tasks:
        raise TraceError(f"{path}: no tasks")
    return tasks
