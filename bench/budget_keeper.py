"""The budget keeper's per-namespace cost: `core.budget.plan.plan_namespace` (what one reconcile of
a namespace computes: settle the ended pods, forget the gone, used / remaining / over) for a
namespace of N GPU pods, a quarter ended and settled already, and one observation folded
(`observe` + `merge`, what each pod watch event costs). Medians of `--repeat` runs.

Run:  PYTHONPATH=src python bench/budget_keeper.py [--pods 100,1000,5000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from fractions import Fraction

from elastic_gpu.core.budget.allowance import Budget
from elastic_gpu.core.budget.ledger import PodRecord, merge, observe
from elastic_gpu.core.budget.plan import plan_namespace
from elastic_gpu.core.budget.settle import Settled

T0 = 1_800_000_000


def ts(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(i: int, ended: bool) -> dict[str, object]:
    state = ({"terminated": {"startedAt": ts(T0 + i), "finishedAt": ts(T0 + i + 60)}}
             if ended else {"running": {"startedAt": ts(T0 + i)}})
    return {"metadata": {"name": f"p{i}", "namespace": "team", "uid": f"u{i}"},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {"tencent.com/vcuda-core": str(25 * (1 + i % 4))}}}]},
            "status": {"phase": "Succeeded" if ended else "Running",
                       "containerStatuses": [{"name": "main", "state": state}]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", default="100,1000,5000")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    budget = Budget(gpu_seconds=10**9, period_s=86_400 * 7, anchor=T0)
    now = T0 + 100_000
    print("| pods | plan_namespace (ms) | one event: observe + merge (us) |")
    print("|---:|---:|---:|")
    for n in (int(x) for x in args.pods.split(",")):
        pods = [pod(i, ended=i % 2 == 0) for i in range(n)]
        ledger: dict[str, PodRecord] = {}
        for p in pods:
            record = observe(p)
            assert record is not None
            ledger[record.uid] = record
        settled = Settled(T0, Fraction(0), frozenset(f"u{i}" for i in range(0, n, 4)))
        present = list(ledger)
        plans, events = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            plan_namespace(budget, settled, ledger, "team", present, now)
            plans.append(time.perf_counter() - start)
            start = time.perf_counter()
            for p in pods[:100]:
                record = observe(p)
                assert record is not None
                merge(ledger[record.uid], record)
            events.append((time.perf_counter() - start) / 100)
        print(f"| {n} | {statistics.median(plans) * 1e3:.2f} | "
              f"{statistics.median(events) * 1e6:.0f} |")


if __name__ == "__main__":
    main()
