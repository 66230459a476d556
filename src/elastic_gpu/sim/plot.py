"""PNG of one replay: allocation and fragmentation against the arrived workload."""

from __future__ import annotations

from pathlib import Path

from elastic_gpu.sim.replay import ReplayResult


def plot_replay(result: ReplayResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alloc = result.allocation_curve()
    rate = result.frag_rate_curve()
    amount = result.frag_amount_curve()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    xs = sorted(alloc)
    top.plot(xs, [alloc[x] for x in xs], label=f"allocated ({result.policy})")
    top.plot(xs, xs, linestyle="--", color="grey", label="arrived")
    top.set_ylabel("% of cluster GPU capacity")
    top.set_title(f"{result.policy} / {result.card_policy}, seed {result.seed}, "
                  f"{result.gpu_capacity} GPUs")
    top.legend(loc="upper left")
    xr = sorted(rate)
    bottom.plot(xr, [rate[x] for x in xr], label="fragmentation rate (% of idle GPU)")
    xa = sorted(amount)
    bottom.plot(xa, [amount[x] for x in xa], label="fragmented GPU (% of capacity)")
    bottom.set_xlabel("arrived GPU request (% of capacity)")
    bottom.set_ylabel("%")
    bottom.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
