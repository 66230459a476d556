"""The GPUBudget CRD (group elasticgpu.io, v1alpha, namespaced): a namespace's GPU-time budget.

    apiVersion: elasticgpu.io/v1alpha
    kind: GPUBudget
    metadata: {name: budget, namespace: team-a}
    spec:
      gpuHours: 100                     # GPU-hours (card-hours) per period
      period: 168h                      # refilled at each period's end (Go duration: h, m, s)
      periodStart: "2026-11-23T00:00:00Z"  # optional: periods are counted from here
                                        #   (default: the object's creationTimestamp)
      halfLife: 24h                     # optional: a decayed usage instead of a hard period
      overBudgetPriorityClassName: egpu-over-budget  # optional: the lower PriorityClass
    status:                             # written by the budget keeper (`egpu controller`)
      used: 12.5                        # GPU-hours in the current period (or decayed)
      remaining: 87.5
      periodStart: ..., periodEnd: ...
      conditions: [{type: OverBudget, status: "False", ...}]

`kubectl get gpubudgets -A` prints budget, used, remaining, period end and OverBudget. The
ledger and decisions are `elastic_gpu.core.budget`; this module is the CRD (one source:
`crd_manifest()`; deploy/crds/gpubudgets.yaml is its YAML form, written by
`python -m elastic_gpu.api.budget --write deploy/crds` and kept equal by a unit test) and the
reading of an object into `core.budget.allowance.Budget`. No I/O. See docs/budgets.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from elastic_gpu.api.crd import column, conditions_schema, crd, to_yaml, write_main
from elastic_gpu.api.elasticgpu import (
    DNS_SUBDOMAIN,
    merge_condition,
)
from elastic_gpu.api.group import ELASTICGPU_VERSION as VERSION
from elastic_gpu.core.budget.allowance import MIN_PERIOD_S, Budget, BudgetState
from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.settle import Settled
from elastic_gpu.core.budget.timestamps import parse_time
from elastic_gpu.core.claims.model import Condition

KIND, PLURAL, SHORT = "GPUBudget", "gpubudgets", "gpubudget"
CRD_FILE = "gpubudgets.yaml"
#: The condition the keeper sets: True while the namespace has spent its budget.
OVER_BUDGET = "OverBudget"
#: A Go duration of whole hours, minutes and seconds ("168h", "1h30m", "30s").
DURATION_PATTERN = r"^([0-9]{1,9}[hms])+$"
_DURATION_PART = re.compile(r"([0-9]{1,9})([hms])")
_UNIT_S = {"h": 3600, "m": 60, "s": 1}
MAX_GPU_HOURS = 10_000_000
#: An exact non-negative rational, as `str(Fraction)` writes it.
SETTLED_PATTERN = r"^[0-9]{1,40}(/[0-9]{1,40})?$"
MAX_SETTLED_UIDS = 10_000


class BudgetObjectError(ValueError):
    """A GPUBudget that cannot be read; the message names the object, field and value."""


def _duration(description: str, minimum: str = "1s", why: str = "") -> dict[str, Any]:
    return {"type": "string", "maxLength": 64, "pattern": DURATION_PATTERN,
            "description": description,
            "x-kubernetes-validations": [{
                "rule": f"duration(self) >= duration('{minimum}')",
                "message": f"must be a duration of at least {minimum}{why}, written with h, m "
                           "and s (e.g. 168h, 1h30m, 30s)"}]}


#: `core.budget.allowance.MIN_PERIOD_S` as the schema writes it (a unit test keeps them equal)
MIN_PERIOD = "1m"


def crd_manifest() -> dict[str, Any]:
    spec = {
        "type": "object",
        "required": ["gpuHours", "period"],
        "properties": {
            "gpuHours": {"type": "number", "minimum": 0, "maximum": MAX_GPU_HOURS,
                         "description": "GPU-hours the namespace may use per period: a GPU "
                                        "container's compute share (a whole card 1.0, a share "
                                        "its percent / 100, a MIG instance its compute slices "
                                        "over its card's: 1/7 a card for an A100 1g, 1/4 "
                                        "for an A30 1g) x "
                                        "the hours it runs"},
            "period": _duration(
                f"The budget is refilled at the end of each period; at least {MIN_PERIOD}: the "
                "status names the current period, so the keeper rewrites it once a period",
                MIN_PERIOD, " (the keeper rewrites the status once a period)"),
            "periodStart": {"type": "string", "format": "date-time",
                            "description": "Periods are counted from here (default: the "
                                           "object's creationTimestamp)"},
            "halfLife": _duration("Optional: instead of a hard period, each GPU-second counts "
                                  "2^(-age / halfLife); the period then only paces the status"),
            "overBudgetPriorityClassName": {
                "type": "string", "minLength": 1, "maxLength": 253, "pattern": DNS_SUBDOMAIN,
                "description": "The PriorityClass new GPU pods of the namespace get while it is "
                               "over budget (default: the one `egpu webhook` is configured "
                               "with)"},
        },
    }
    status = {
        "type": "object",
        "properties": {
            "used": {"type": "number", "minimum": 0,
                     "description": "GPU-hours used in the current period (decayed, with "
                                    "halfLife)"},
            "remaining": {"type": "number", "minimum": 0,
                          "description": "GPU-hours left in the current period"},
            "periodStart": {"type": "string", "format": "date-time"},
            "periodEnd": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "conditions": conditions_schema(),
            "settled": {
                "type": "object",
                "description": "The keeper's durable ledger: GPU-seconds of the pods that "
                               "ended in the period starting at periodStart (exact, p or p/q) "
                               "and the UIDs of those whose finalizer may still be on",
                "required": ["periodStart", "gpuSeconds"],
                "properties": {
                    "periodStart": {"type": "string", "format": "date-time"},
                    "gpuSeconds": {"type": "string", "maxLength": 128,
                                   "pattern": SETTLED_PATTERN},
                    "uids": {"type": "array", "maxItems": MAX_SETTLED_UIDS,
                             "x-kubernetes-list-type": "set",
                             "items": {"type": "string", "maxLength": 128}},
                },
            },
        },
    }
    schema = {
        "type": "object",
        "description": "A namespace's GPU-time budget: in budget its pods keep their priority; "
                       "over budget new GPU pods get the lower PriorityClass (evicted first).",
        "required": ["spec"],
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                       "metadata": {"type": "object"}, "spec": spec, "status": status},
    }
    columns = [
        column("Budget", "number", ".spec.gpuHours", "GPU-hours per period"),
        column("Used", "number", ".status.used", "GPU-hours used in the current period"),
        column("Remaining", "number", ".status.remaining", "GPU-hours left in the period"),
        column("Period", "string", ".spec.period", "Refill period"),
        column("PeriodEnd", "string", ".status.periodEnd", "When the budget refills"),
        column("OverBudget", "string", f'.status.conditions[?(@.type=="{OVER_BUDGET}")].status',
                "True while new GPU pods get the lower PriorityClass"),
        column("HalfLife", "string", ".spec.halfLife", "Decay half-life", priority=1),
        column("Age", "date", ".metadata.creationTimestamp", "Age"),
    ]
    return crd(KIND, PLURAL, SHORT, "Namespaced", schema, columns, status=True, version=VERSION)


#: The PriorityClass of over-budget namespaces' new GPU pods, as the sandbox and the chart
#: create it (charts/elastic-gpu values `budgets.overBudgetPriorityClass`; a test keeps them
#: equal): below the default 0, so preemption evicts these pods first; `Never`: they wait for
#: room and evict nobody themselves.
OVER_BUDGET_CLASS = "egpu-over-budget"
OVER_BUDGET_VALUE = -100
OVER_BUDGET_PREEMPTION = "Never"


def priority_class_manifest(name: str = OVER_BUDGET_CLASS, value: int = OVER_BUDGET_VALUE,
                            preemption_policy: str = OVER_BUDGET_PREEMPTION) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "globalDefault": False,
            "preemptionPolicy": preemption_policy,
            "description": "GPU pods of a namespace over its GPU budget (Elastic GPU)"}


def crd_yaml() -> str:
    header = (f"# {KIND} (elasticgpu.io/{VERSION}): see docs/budgets.md.\n"
              "# Generated by `python -m elastic_gpu.api.budget --write deploy/crds` from\n"
              "# elastic_gpu.api.budget.crd_manifest() (a unit test keeps them equal).\n")
    return header + to_yaml(crd_manifest())


def parse_duration(value: Any, what: str, minimum_s: int = 1) -> int:
    """A duration of the CRD's form ("168h", "1h30m", "30s") -> seconds, at least
    `minimum_s`."""
    if not isinstance(value, str) or not re.fullmatch(DURATION_PATTERN, value):
        raise BudgetObjectError(f"{what}={value!r} is not a duration written with h, m and s "
                                "(e.g. 168h, 1h30m, 30s)")
    seconds = sum(int(n) * _UNIT_S[u] for n, u in _DURATION_PART.findall(value))
    if seconds < minimum_s:
        raise BudgetObjectError(f"{what}={value!r} must be at least {minimum_s}s")
    return seconds


def budget_from_object(obj: Mapping[str, Any]) -> Budget:
    """A GPUBudget as the API serves it -> `core.budget.allowance.Budget` (GPU-seconds per period)."""
    meta = obj.get("metadata") or {}
    where = f"GPUBudget {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise BudgetObjectError(f"{where}: spec is missing")
    hours = spec.get("gpuHours")
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not 0 <= hours <= MAX_GPU_HOURS:
        raise BudgetObjectError(f"{where}: spec.gpuHours={hours!r} is not a number 0-{MAX_GPU_HOURS}")
    period = parse_duration(spec.get("period"), f"{where}: spec.period", MIN_PERIOD_S)
    half_life = (parse_duration(spec["halfLife"], f"{where}: spec.halfLife")
                 if spec.get("halfLife") is not None else None)
    start = spec.get("periodStart") or meta.get("creationTimestamp")
    try:
        anchor = parse_time(start, f"{where}: spec.periodStart") if start else 0
    except BudgetError as err:
        raise BudgetObjectError(str(err)) from None
    gpu_seconds = int(Fraction(str(hours)) * 3600)
    try:
        return Budget(gpu_seconds, period, anchor, half_life)
    except BudgetError as err:
        raise BudgetObjectError(f"{where}: {err}") from None


def _time(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def settled_from_status(obj: Mapping[str, Any], budget: Budget) -> Settled:
    """The durable settled part a GPUBudget's status holds (an empty one for the current
    period of `budget` when it has none yet)."""
    meta = obj.get("metadata") or {}
    where = f"GPUBudget {meta.get('namespace', '?')}/{meta.get('name', '?')}"
    raw = (obj.get("status") or {}).get("settled")
    if raw is None:
        return Settled(budget.anchor)
    try:
        start = parse_time(raw.get("periodStart"), f"{where}: status.settled.periodStart")
    except BudgetError as err:
        raise BudgetObjectError(str(err)) from None
    text = raw.get("gpuSeconds")
    if not isinstance(text, str) or not re.fullmatch(SETTLED_PATTERN, text) or \
            text.endswith("/0"):
        raise BudgetObjectError(f"{where}: status.settled.gpuSeconds={text!r} is not an exact "
                                "non-negative number (p or p/q)")
    uids = raw.get("uids") or []
    if not isinstance(uids, list) or not all(isinstance(u, str) for u in uids):
        raise BudgetObjectError(f"{where}: status.settled.uids={uids!r} is not a list of UIDs")
    return Settled(start, Fraction(text), frozenset(uids))


def budget_status(obj: Mapping[str, Any], budget: Budget, state: BudgetState,
                  settled: Settled, now: int) -> dict[str, Any]:
    """The GPUBudget status for a status-subresource patch: used and remaining in GPU-hours,
    the period, the merged OverBudget condition and the settled part."""
    meta = obj.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    hours_used = float(state.used) / 3600
    allowed = budget.gpu_seconds / 3600
    condition = Condition(
        OVER_BUDGET, "True" if state.over else "False",
        "OverBudget" if state.over else "InBudget",
        f"{hours_used:.4g} of {allowed:.4g} GPU-hours used in the period ending "
        f"{_time(state.period_end)}" + ("; new GPU pods get the lower PriorityClass"
                                        if state.over else ""))
    existing = (obj.get("status") or {}).get("conditions") or []
    return {
        "used": round(hours_used, 4),
        "remaining": round(float(state.remaining) / 3600, 4),
        "periodStart": _time(state.period_start),
        "periodEnd": _time(state.period_end),
        "observedGeneration": generation,
        "conditions": merge_condition(existing, condition, _time(now), generation),
        "settled": {"periodStart": _time(settled.period_start),
                    "gpuSeconds": str(settled.gpu_seconds), "uids": sorted(settled.uids)},
    }


def status_changed(obj: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether writing `status` (from `budget_status`) would change the object's: an equal one
    is not written (a write bumps the resourceVersion and wakes every watcher for nothing)."""
    return dict(obj.get("status") or {}) != dict(status)


def _main(argv: list[str] | None = None) -> int:
    return write_main("Write the GPUBudget CRD as YAML.", {CRD_FILE: crd_yaml}, argv)


if __name__ == "__main__":
    raise SystemExit(_main())
