"""The extender: kube-scheduler's filter, prioritize, bind and preempt, and the controller's
provision, over HTTP.

`Extender` is its parts over one base (`extender.ExtenderBase`: the fields, the API clients,
the calls into the state): `http` (routes, limits, where a request runs), `verbs` (filter,
prioritize, preempt), `binder` (bind, claim binding), `provisioner` (/provision).
"""

from __future__ import annotations

from elastic_gpu.scheduler.binder import Binder
from elastic_gpu.scheduler.http import HttpRoutes
from elastic_gpu.scheduler.provisioner import Provisioner
from elastic_gpu.scheduler.verbs import Verbs


class Extender(HttpRoutes, Verbs, Binder, Provisioner):
    """The whole extender: serve `app()`; `drained()` on shutdown."""
