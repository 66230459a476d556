"""The webhook's budget lookups: is a pod's namespace over its GPU budget, and what is the lower
PriorityClass's value? Feeds `core.admission.admit.admit(..., budget=)` (`core.admission.mutators.budget`).

- GPUBudgets: an informer (`webhook.cluster.CrdCache`); a namespace is over budget while its
  GPUBudget (the first by name, as the keeper reads it) has the condition `OverBudget=True`
  that the budget keeper writes (`core.budget.allowance.over_budget`). The lower class:
  `core.budget.priority.downgrade_class` (`spec.overBudgetPriorityClassName`, else the
  webhook's `--over-budget-priority-class`).
- PriorityClasses: an informer (cluster-scoped) for the class's `value` and
  `preemptionPolicy`.

Whether a namespace has a GPUBudget at all decides whether its GPU pods get the budget
keeper's finalizer (`core.admission.mutators.budget.budget_finalizer`, issue #26).

Cache misses and failures (docs/budgets.md, "The webhook's lookups"):
- GPUBudgets not synced yet (the webhook just started, or the API failed its list): the
  namespace's GPUBudgets are read live. Once synced, a namespace the cache has no GPUBudget
  for has no budget (no call per pod; a GPUBudget created within the watch's latency is missed
  for that moment).
- The lower class not in the cache: read live.
- Any read that fails, or a class that does not exist: the pod is admitted as it is, in
  budget (fail open: a budget lowers priorities, it never refuses pods), logged and counted in
  `elasticgpu_webhook_budget_lookups{source="failed"}`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.budget.priority import NamespaceBudget, PriorityDowngrade, downgrade_class
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.informer import ListWatcher
from elastic_gpu.kube.resources import BUDGETS, PRIORITY_CLASSES
from elastic_gpu.webhook.cluster import CrdCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetFacts:
    """What the webhook needs of one GPUBudget."""

    name: str
    over: bool
    priority_class: str | None


def budget_facts(obj: Mapping[str, Any]) -> BudgetFacts | None:
    from elastic_gpu.api.budget import OVER_BUDGET

    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    over = any(isinstance(c, Mapping) and c.get("type") == OVER_BUDGET and
               c.get("status") == "True" for c in conditions)
    name = spec.get("overBudgetPriorityClassName") if isinstance(spec, Mapping) else None
    return BudgetFacts(str(meta.get("name", "")), over, name if isinstance(name, str) else None)


def class_facts(obj: Mapping[str, Any]) -> tuple[int, str | None] | None:
    value = obj.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    policy = obj.get("preemptionPolicy")
    return value, policy if isinstance(policy, str) else None


class BudgetCache(CrdCache[BudgetFacts]):
    kind = "GPUBudget"

    def __init__(self, crd_retry_s: float = 10.0) -> None:
        super().__init__(BUDGETS, budget_facts, crd_retry_s)

    def of(self, namespace: str) -> BudgetFacts | None:
        mine = sorted(k[1] for k in self.objects if k[0] == namespace)
        return self.objects[(namespace, mine[0])] if mine else None


class PriorityClassCache(CrdCache[tuple[int, str | None]]):
    kind = "PriorityClass"

    def __init__(self) -> None:
        super().__init__(PRIORITY_CLASSES, class_facts)

    def of(self, name: str) -> tuple[int, str | None] | None:
        return self.objects.get(("", name))


class BudgetLookup:
    """`await lookup(namespace)` -> what a new GPU pod of `namespace` gets
    (`NamespaceBudget`): whether it has a GPUBudget (True when that cannot be told: the
    keeper removes a finalizer its namespace does not need, a missing one may lose usage), and
    the downgrade (None: in budget, no budget, the lookup failed: fail open, or `default_class`
    empty: no downgrades)."""

    def __init__(self, default_class: str, on_lookup: Callable[[str], None] = lambda _: None
                 ) -> None:
        self.default_class = default_class
        self.budgets = BudgetCache()
        self.classes = PriorityClassCache()
        self.client: Any = None
        #: the live reads' client (`kube.client.KubeClient`, paths by `kube.paths.api_path`)
        self.reader: Any = None
        self.on_lookup = on_lookup

    async def _budget(self, namespace: str) -> BudgetFacts | None:
        if self.budgets.synced.is_set() or self.reader is None:
            self.on_lookup("cache")
            return self.budgets.of(namespace)
        path = BUDGETS.path(namespace)
        self.on_lookup("api")
        try:
            listed, _ = await self.reader.list(path)
        except NotFound:  # the CRD is not installed: no budgets
            return None
        items = [budget_facts(o) for o in listed]
        found = sorted((f for f in items if f is not None), key=lambda f: f.name)
        return found[0] if found else None

    async def _class(self, name: str) -> tuple[int, str | None] | None:
        known = self.classes.of(name)
        if known is not None or self.reader is None:
            return known
        path = PRIORITY_CLASSES.path(name=name)  # a GPUBudget's field: checked, escaped
        self.on_lookup("api")
        try:
            obj = await self.reader.get(path)
        except NotFound:
            return None
        return class_facts(obj)

    async def __call__(self, namespace: str) -> NamespaceBudget:
        try:
            facts = await self._budget(namespace)
            if facts is None:
                return NamespaceBudget(budgeted=False)
            name = downgrade_class(facts.over, facts.priority_class, self.default_class)
            if name is None:
                return NamespaceBudget(budgeted=True)
            found = await self._class(name)
        except Exception as err:  # the API is unreachable: admit the pod as it is
            self.on_lookup("failed")
            log.warning("GPU budget of namespace %s not read (%s: %s); the pod keeps its "
                        "priority", namespace, type(err).__name__, err)
            return NamespaceBudget(budgeted=True)
        if found is None:
            self.on_lookup("failed")
            log.warning("namespace %s is over its GPU budget but PriorityClass %s does not "
                        "exist; the pod keeps its priority", namespace, name)
            return NamespaceBudget(budgeted=True)
        return NamespaceBudget(True, PriorityDowngrade(name, found[0], found[1]))

    async def run(self, client: ListWatcher) -> None:
        self.client = client
        await asyncio.gather(self.budgets.run(client), self.classes.run(client))
