"""`egpu controller`: one leader-elected process for every controller of the project.

`manager.py` runs the shared informers, leader election, the metrics/health port and every
registered controller (`registry.py`); `claims/` is the claims binder / provisioner trigger /
reclaimer; `mig/` is the MIG adapter; `budget.py` is the budget keeper; `provisioning.py`
calls the extender's `POST /provision`. The API resources they read and write come from one
table, `kube.resources`.
"""
