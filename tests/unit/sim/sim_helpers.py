"""Tiny trace files for simulator tests, and an independent checker of the placements a run
writes."""

from __future__ import annotations

import csv
import random
from collections import Counter, defaultdict
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


def check_placements(nodes_csv: Path, pods_csv: Path, placements_csv: Path) -> int:
    """Re-read the trace and the placements with nothing from the simulator, and verify every
    capacity and model constraint. Returns the number of placements checked."""
    nodes = {r["sn"]: r for r in csv.DictReader(nodes_csv.open())}
    tasks = {r["name"]: r for r in csv.DictReader(pods_csv.open())}
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    card_milli: dict[tuple[str, int], int] = defaultdict(int)
    whole_cards: set[tuple[str, int]] = set()
    rows = list(csv.DictReader(placements_csv.open()))
    assert rows, "no placements"
    for row in rows:
        task = tasks[row["task"].split("#")[0]]
        node = nodes[row["node"]]
        assert int(node["gpu"]) > 0
        cpu[row["node"]] += int(task["cpu_milli"])
        mem[row["node"]] += int(task["memory_mib"])
        cards = [c for c in row["cards"].split(";") if c]
        assert len(cards) == int(task["num_gpu"])
        spec = (task.get("gpu_spec") or "").split("|")
        if cards and any(spec):
            assert node["model"] in spec
        for item in cards:
            index, milli = (int(x) for x in item.split(":"))
            assert 0 <= index < int(node["gpu"])
            assert milli == int(task["gpu_milli"])
            key = (row["node"], index)
            assert key not in whole_cards, "a whole card was shared"
            card_milli[key] += milli
            if milli == 1000:
                whole_cards.add(key)
                assert card_milli[key] == 1000, "a whole card was given while partly used"
    for key, used in card_milli.items():
        assert used <= 1000, key
    for name in cpu:
        assert cpu[name] <= int(nodes[name]["cpu_milli"])
        assert mem[name] <= int(nodes[name]["memory_mib"])
    return len(rows)
