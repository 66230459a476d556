"""Time as the budget ledger counts it: whole seconds since the epoch, read from the API's
RFC 3339 timestamps."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from elastic_gpu.core.budget.errors import BudgetError

#: Seconds since the epoch (Kubernetes timestamps have whole seconds).
Seconds = int


def parse_time(value: Any, what: str) -> Seconds:
    """An RFC 3339 timestamp as the API writes it (`2026-11-24T04:05:06Z`) -> epoch seconds."""
    if not isinstance(value, str):
        raise BudgetError(f"{what}={value!r} is not an RFC 3339 timestamp")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BudgetError(f"{what}={value!r} is not an RFC 3339 timestamp") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return math.floor(parsed.timestamp())
