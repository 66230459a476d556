"""What a bind costs the extender's process, this tree against a baseline checkout, side by side
in one invocation: the bind verb (read the pod, reserve, the Binding answered at once, settle)
and the watch's two events of the bound pod (the Binding's, then the kubelet's Running), per
pod, with pods of distinct shapes on N nodes x 8 cards. Also counted, outside the timed runs:
the engine's changes and `PodInfo.from_manifest` calls per pod.

    git worktree add --detach /tmp/bind-main main
    .venv/bin/python bench/state_bind.py --baseline /tmp/bind-main --nodes 500 --pods 2000 --rounds 5

Each round runs the baseline's and this tree's worker (`--worker`, a fresh process on that
tree's `src/`), alternately; the table shows the medians of the rounds' per-pod microseconds of
CPU time (`time.process_time`: on a shared box, wall time counts the other programs' turns).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


class AnsweringApi:
    """The API worker answering every Binding at once; keeps the bound pod for the watch."""

    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        self.pods = pods
        self.bound: dict[str, dict[str, Any]] = {}

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        after = copy.deepcopy(self.pods[uid])
        after["metadata"]["annotations"] = {**after["metadata"].get("annotations", {}),
                                            **annotations}
        after["metadata"]["resourceVersion"] = str((resource_version or 0) + 1)
        after["spec"]["nodeName"] = node
        self.bound[uid] = after


def pending_pods(count: int) -> list[dict[str, Any]]:
    """Distinct shapes: compute share, memory and CPU vary together."""
    from egpu_testing.workbench import pod_manifest

    out = []
    for i in range(count):
        pod = pod_manifest(f"p{i}", uid=f"uid-{i}", containers={"main": {
            "elasticgpu.io/gpu-core": str(5 + i % 40), "elasticgpu.io/gpu-memory": str(512 + i),
            "cpu": f"{100 + i % 900}m", "memory": f"{256 + i % 1024}Mi"}})
        pod["metadata"]["resourceVersion"] = "3"
        out.append(pod)
    return out


def running(pod: dict[str, Any]) -> dict[str, Any]:
    later = copy.deepcopy(pod)
    later["metadata"]["resourceVersion"] = str(int(later["metadata"]["resourceVersion"]) + 1)
    later["status"] = {"phase": "Running"}
    return later


def counting(target: Any, names: tuple[str, ...], calls: Counter[str]) -> Callable[[], None]:
    """Count calls of `names` on `target` (those it has); returns the undo."""
    wrapped = []
    for name in names:
        method = getattr(target, name, None)
        if method is None:
            continue

        def call(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
            calls[_n] += 1
            return _m(*args, **kwargs)
        setattr(target, name, call)
        wrapped.append(name)

    def undo() -> None:
        for name in wrapped:
            delattr(target, name)
    return undo


async def one_run(nodes: int, count: int, counted: bool) -> dict[str, float]:
    from egpu_testing.workbench import ready_state
    from elastic_gpu.core.model import Card, Node
    try:
        from elastic_gpu.scheduler.extender import Extender
    except ImportError:  # a baseline from before the extender was split into objects
        from elastic_gpu.scheduler.server import Extender  # type: ignore[no-redef,attr-defined]
    from elastic_gpu.scheduler.state import PodInfo

    inventory = [Node(f"node-{n:04d}", 96_000, 1 << 20, tuple(
        Card(c, f"GPU-{n}-{c}", "A100", 81920) for c in range(8))) for n in range(nodes)]
    state = ready_state(inventory)
    pods = pending_pods(count)
    api = AnsweringApi({p["metadata"]["uid"]: p for p in pods})
    extender = Extender(state, api)
    for pod in pods:
        state.observe_pod(pod)  # the watch's pending pods, before any bind
    calls: Counter[str] = Counter()
    undo = [counting(state.engine, ("allocate", "release", "rekey", "set_outside_usage"), calls)]
    if counted:
        read = PodInfo.__dict__["from_manifest"]

        def from_manifest(pod: Any) -> Any:
            calls["from_manifest"] += 1
            return read.__func__(pod)
        PodInfo.from_manifest = staticmethod(from_manifest)  # type: ignore[method-assign]
        undo.append(lambda: setattr(PodInfo, "from_manifest", read))
    else:
        for u in undo:
            u()
        undo = []
    bind_s = watch_s = 0.0
    in_bind: Counter[str] = Counter()
    for i, pod in enumerate(pods):
        meta = pod["metadata"]
        body = json.dumps({"PodName": meta["name"], "PodNamespace": "default",
                           "PodUID": meta["uid"], "Node": inventory[i % nodes].name}).encode()
        before = Counter(calls)
        start = time.process_time()
        answer = await extender.bind(body)
        bind_s += time.process_time() - start
        in_bind += Counter(calls) - before
        assert answer.text is not None and json.loads(answer.text)["Error"] == "", answer.text
        bound = api.bound[meta["uid"]]
        later = running(bound)
        start = time.process_time()
        state.observe_pod(bound)
        state.observe_pod(later)
        watch_s += time.process_time() - start
    for u in undo:
        u()
    return {"bind_us": bind_s / count * 1e6, "watch_us": watch_s / count * 1e6,
            **{f"{k}_per_pod": v / count for k, v in calls.items()},
            **{f"{k}_in_bind": v / count for k, v in in_bind.items()}}


def worker(args: argparse.Namespace) -> None:
    counts = asyncio.run(one_run(args.nodes, min(args.pods, 200), counted=True))
    timed = asyncio.run(one_run(args.nodes, args.pods, counted=False))
    print(json.dumps({**timed, **{k: v for k, v in counts.items() if k.endswith(("_per_pod", "_in_bind"))}}))


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree / 'tests'}"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                          "--nodes", str(args.nodes), "--pods", str(args.pods)],
                         env=env, check=True, capture_output=True, text=True, cwd=tree)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def git_head(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout to compare with (e.g. main)")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    trees = ([("baseline " + git_head(args.baseline), args.baseline.resolve())]
             if args.baseline else []) + [("this tree " + git_head(HERE), HERE)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for _ in range(args.rounds):
        for name, tree in trees:
            results[name].append(run_tree(tree, args))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor())
    print(f"{args.nodes} nodes x 8 cards, {args.pods} pods of distinct shapes, "
          f"{args.rounds} rounds (medians); {cpu}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    keys = ("bind_us", "watch_us", "allocate_per_pod", "release_per_pod", "rekey_per_pod",
            "set_outside_usage_per_pod", "from_manifest_in_bind", "from_manifest_per_pod")
    print("| tree | bind µs | watch events µs | bind + watch µs | allocate | release | rekey "
          "| set_outside_usage | from_manifest in the bind | from_manifest with the watch's |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}
        print(f"| {name} | {med['bind_us']:.0f} | {med['watch_us']:.0f} | "
              f"{med['bind_us'] + med['watch_us']:.0f} | "
              + " | ".join(f"{med[k]:g}" for k in keys[2:]) + " |")


if __name__ == "__main__":
    main()
