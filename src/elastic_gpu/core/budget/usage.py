"""GPU-seconds (card-seconds) from the ledger: of a time window (`usage`), decayed with a
half-life (`decayed_usage`), and what is being spent now (`burn_rate`)."""

from __future__ import annotations

import math
from fractions import Fraction

from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.ledger import Ledger, PodRecord
from elastic_gpu.core.budget.timestamps import Seconds


def _overlap(start: Seconds, end: Seconds | None, lo: Seconds, hi: Seconds, now: Seconds) -> int:
    stop = now if end is None else end
    return max(0, min(stop, hi, now) - max(start, lo))


def record_usage(record: PodRecord, lo: Seconds, hi: Seconds, now: Seconds) -> Fraction:
    """GPU-seconds (card-seconds) the pod used in [lo, hi), counting open runs up to `now`."""
    total = Fraction(0)
    for container in record.containers.values():
        seconds = sum(_overlap(s, record.stop(e), lo, hi, now)
                      for s, e in container.runs.items())
        total += container.share * seconds
    return total


def usage(ledger: Ledger, lo: Seconds, hi: Seconds, now: Seconds) -> dict[str, Fraction]:
    """GPU-seconds per namespace in [lo, hi) (namespaces with no record are absent)."""
    out: dict[str, Fraction] = {}
    for record in ledger.values():
        used = record_usage(record, lo, hi, now)
        if used:
            out[record.namespace] = out.get(record.namespace, Fraction(0)) + used
    return out


def decayed_usage(ledger: Ledger, half_life_s: int, now: Seconds) -> dict[str, float]:
    """GPU-seconds per namespace, each second weighted 2^(-(now - t) / half_life): the integral
    of share x 2^(-(now-t)/h) over every run up to `now`."""
    if half_life_s <= 0:
        raise BudgetError(f"halfLife={half_life_s}s must be positive")
    k = math.log(2) / half_life_s
    out: dict[str, float] = {}
    for record in ledger.values():
        total = 0.0
        for container in record.containers.values():
            for start, end in container.runs.items():
                end = record.stop(end)
                stop = min(now, now if end is None else end)
                if stop <= start:
                    continue
                total += float(container.share) * (math.exp(-k * (now - stop))
                                                   - math.exp(-k * (now - start))) / k
        if total:
            out[record.namespace] = out.get(record.namespace, 0.0) + total
    return out



def burn_rate(ledger: Ledger, namespace: str) -> Fraction:
    """Cards the namespace's running containers hold now (GPU-seconds per second)."""
    return sum((c.share for r in ledger.values() if r.namespace == namespace and not r.final
                for c in r.containers.values()
                if any(r.stop(e) is None for e in c.runs.values())), Fraction(0))
