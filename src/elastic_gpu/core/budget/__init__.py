"""Namespace GPU budgets: the GPU-time ledger and the over-budget decision. Pure, no I/O.

One module per reason (docs/budgets.md):

- `errors`: `BudgetError`, what a pod or budget the ledger cannot read raises;
- `timestamps`: `Seconds` and `parse_time` (Kubernetes timestamps as epoch seconds);
- `shares`: each GPU container's compute share in cards (`container_shares`);
- `ledger`: what one observation of a pod says (`observe`), records merged as a
  join-semilattice (`merge`);
- `usage`: GPU-seconds of a window (`usage`), decayed (`decayed_usage`), the burn rate;
- `allowance`: a namespace's `Budget`, its periods, and whether it is over (`over_budget`);
- `settle`: lossless end-of-pod accounting (`Settled`, `settle`, `namespace_used`) and the
  keeper's `FINALIZER`;
- `plan`: what the keeper does for a namespace now (`plan_namespace`, `next_check`);
- `priority`: what an over-budget namespace's new GPU pods get (`downgrade_class`,
  `PriorityDowngrade`, `NamespaceBudget`): the webhook's half of the decision.

Consumption is the compute share of every GPU container times the time it ran, read from what
the API says of a pod (DESIGN.md 7.4). Usage is never an accumulated counter: it is computed as
the overlap of each run with a time window, so the usage of a period, and its split at a period
boundary, follow from the records.
"""
