"""`egpu controller`: one leader-elected process for every controller of the project.

`manager.py` runs the shared informers, leader election, the metrics/health port and every
registered controller (`registry.py`); `claims.py` is the claims binder / provisioner trigger /
reclaimer; `provisioning.py` calls the extender's `POST /provision`.
"""
