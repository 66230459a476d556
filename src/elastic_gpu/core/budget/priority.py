"""What a new GPU pod of an over-budget namespace gets: the lower PriorityClass
(`core.admission.mutators.budget.budget_priority` writes it). The keeper decides whether a
namespace is over (`allowance.over_budget`, written as the `OverBudget` condition); the
webhook reads that condition and asks `downgrade_class` which class, then the class's value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PriorityDowngrade:
    """What the mutating webhook gives a GPU pod of an over-budget namespace: the lower
    PriorityClass and its value (the apiserver's Priority plugin ran before the webhooks, so
    `spec.priority` must be set to match), and its preemptionPolicy when it has one."""

    priority_class: str
    priority: int
    preemption_policy: str | None = None


@dataclass(frozen=True)
class NamespaceBudget:
    """What the mutating webhook knows of a pod's namespace's GPU budget."""

    #: the namespace has a GPUBudget (or that cannot be told): its GPU pods get the keeper's
    #: `FINALIZER`, so their usage is settled losslessly; a namespace without one gets none,
    #: so no deleted pod of it waits for `egpu controller` (issue #26)
    budgeted: bool = False
    #: the lower PriorityClass while the namespace is over budget
    downgrade: PriorityDowngrade | None = None




def downgrade_class(over: bool, budget_class: str | None, default_class: str) -> str | None:
    """The PriorityClass a namespace's new GPU pods get: while it is `over` budget, its
    GPUBudget's own (`spec.overBudgetPriorityClassName`, `budget_class`), else the webhook's
    `default_class`; None in budget, or with no default class (`--over-budget-priority-class
    ''`: downgrades are off, whatever a GPUBudget names)."""
    if not over or not default_class:
        return None
    return budget_class or default_class
