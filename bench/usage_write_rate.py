"""The API write rate of observed usage (`status.usage`, issue 28) at cluster scale.

    .venv/bin/python bench/usage_write_rate.py [--nodes 200] [--cards 8] [--hours 1]
                                               [--scale 15000] [--seed 1]

No cluster: the agent's own decision (`core.usage.plan_writes`, with the agent config's
defaults: sample every 5 s, one round per 30 s, out-of-band threshold 1 GiB, memory rounded to
a figure written again when it moved 256 MiB or 10 points since its last write, refresh
after 300 s) is driven by a usage process per card, on
`--nodes` simulated nodes for `--hours` of simulated time; nodes are independent, so the
cluster's rate is the per-node rate times `--scale` (15,000 nodes). Printed beside it, from the
same run and the same usage (same seed): finer steps (5 points), no steps (every change written
each round), and the bound (every card of every node every round).

The usage process (per card, at random): 30 % idle cards (no holder; a rare out-of-band
process, 1 in 2,000 cards per hour, lasting 10 minutes); 40 % training (one holder, memory
steady after a ramp, SM 90-100 % with noise); 20 % inference (two holders, memory drifting by
up to 64 MiB per sample, SM a random walk between 5 and 80 %); 10 % churn (a holder that comes
and goes, mean lifetime 20 minutes, memory and SM as training while present).
"""

from __future__ import annotations

import argparse
import random
import time

from elastic_gpu.core.usage import CardUsage, ContainerUsage, WritePlan, WritePolicy, Written, plan_writes

SAMPLE_S = 5.0


class CardProcess:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        kind = rng.random()
        self.kind = ("idle" if kind < 0.3 else "train" if kind < 0.7 else "infer" if kind < 0.9
                     else "churn")
        self.memory = [rng.randrange(8000, 70000)] if self.kind in ("train", "churn") else (
            [rng.randrange(4000, 20000), rng.randrange(4000, 20000)] if self.kind == "infer"
            else [])
        self.sm = rng.randrange(5, 80)
        self.present = True
        self.oob_until = -1.0

    def step(self, now: float) -> CardUsage:
        rng = self.rng
        if self.kind == "idle" and self.oob_until < now and \
                rng.random() < SAMPLE_S / 3600 / 2000:
            self.oob_until = now + 600
        oob = 6000 if self.oob_until >= now else 0
        if self.kind == "churn" and rng.random() < SAMPLE_S / 1200:
            self.present = not self.present
        containers: list[ContainerUsage] = []
        if self.kind in ("train", "churn") and self.present:
            sm = min(100, max(0, 95 + rng.randint(-5, 5)))
            containers = [ContainerUsage("ns", "train", "main", self.memory[0], sm)]
        elif self.kind == "infer":
            self.memory = [max(1000, m + rng.randint(-64, 64)) for m in self.memory]
            self.sm = min(80, max(5, self.sm + rng.randint(-6, 6)))
            containers = [ContainerUsage("ns", f"serve-{i}", "app", m, self.sm // 2)
                          for i, m in enumerate(self.memory)]
        used = sum(c.memory_mib for c in containers) + oob
        sm = min(100, sum(c.sm_percent or 0 for c in containers))
        return CardUsage(used, oob, sm, containers=tuple(containers))


def run(nodes: int, cards: int, hours: float, seed: int, policy: WritePolicy) -> int:
    rng = random.Random(seed)
    processes = [[CardProcess(rng) for _ in range(cards)] for _ in range(nodes)]
    written: list[dict[int, Written]] = [{} for _ in range(nodes)]
    last_round: list[float | None] = [None] * nodes
    writes = 0
    steps = int(hours * 3600 / SAMPLE_S)
    for step in range(steps):
        now = step * SAMPLE_S
        for n in range(nodes):
            sampled = {i: p.step(now) for i, p in enumerate(processes[n])}
            plan: WritePlan = plan_writes(sampled, written[n], last_round[n], now, policy)
            if plan.periodic:
                last_round[n] = now
            for index in plan.cards:
                written[n][index] = Written(sampled[index], now)
            if step > 0:  # the start's first write of every card is not the steady rate
                writes += len(plan.cards)
    return writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--scale", type=int, default=15000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    seconds = args.hours * 3600
    default = WritePolicy()
    exact = WritePolicy(memory_quantum_mib=1, percent_quantum=1)
    rows = []
    for name, policy in (("defaults (256 MiB, 10 points, refresh 300 s)", default),
                         ("5 points", WritePolicy(percent_quantum=5)),
                         ("no steps (1 MiB, 1 point)", exact)):
        started = time.perf_counter()
        writes = run(args.nodes, args.cards, args.hours, args.seed, policy)
        per_node = writes / args.nodes / seconds
        rows.append((name, per_node, per_node * args.scale, time.perf_counter() - started))
    bound = args.cards / default.period_s
    print(f"{args.nodes} simulated nodes x {args.cards} cards, {args.hours} h simulated, "
          f"scaled to {args.scale} nodes\n")
    print("| policy | writes/s per node | writes/s at scale | vs. bound | run (s) |")
    print("|---|---|---|---|---|")
    for name, per_node, total, took in rows:
        print(f"| {name} | {per_node:.4f} | {total:.0f} | {per_node / bound:.2f} | {took:.1f} |")
    print(f"| bound: every card every round | {bound:.4f} | {bound * args.scale:.0f} | 1.00 | |")


if __name__ == "__main__":
    main()
