"""Tiny trace files for simulator tests."""

from __future__ import annotations

import random
from pathlib import Path

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    "scheduled_time\n")


def write_nodes(path: Path) -> Path:
    rows = [
        "cpu-0,32000,65536,0,",
        "g8-0,96000,393216,8,G2",
        "g8-1,96000,393216,8,G2",
        "t4-0,16000,65536,2,T4",
        "t4-1,16000,32768,2,T4",
        "p1-0,8000,16384,1,P100",
    ]
    path.write_text(NODE_HEADER + "\n".join(rows) + "\n")
    return path


def write_pods(path: Path, count: int = 60, seed: int = 1, five_columns: bool = False) -> Path:
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.15:
            gpu, milli = 0, 0
        elif kind < 0.55:
            gpu, milli = 1, rng.choice((100, 250, 470, 810))
        elif kind < 0.9:
            gpu, milli = 1, 1000
        else:
            gpu, milli = rng.choice((2, 4, 8)), 1000
        cpu = rng.choice((1000, 2000, 6000, 12000))
        mem = rng.choice((2048, 8192, 16384))
        spec = rng.choice(("", "", "", "T4", "G2|P100")) if gpu else ""
        if five_columns:
            lines.append(f"pod-{i:03d},{cpu},{mem},{gpu},{milli}")
        else:
            lines.append(f"pod-{i:03d},{cpu},{mem},{gpu},{milli},{spec},LS,Running,0,1,0")
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" if five_columns else POD_HEADER
    path.write_text(header + "\n".join(lines) + "\n")
    return path
