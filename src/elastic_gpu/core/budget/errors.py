"""What the budget ledger raises for a pod or budget it cannot read."""

from __future__ import annotations


class BudgetError(ValueError):
    """A pod or budget the ledger cannot read; the message names the field and value."""
