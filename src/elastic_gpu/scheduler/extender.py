"""The extender: kube-scheduler's filter, prioritize, bind and preempt, and the controller's
provision, over HTTP.

`Extender` is four objects joined by one `handle.Handle` (the state, the API, the config, the
metrics, this replica's role): `Verbs` (filter, prioritize, preempt; the parsed-request and
recent-pods caches), `Binder` (bind, claim binding; it reads the pods filter saw),
`Provisioner` (/provision) and `HttpRoutes` (routes, limits, where a request runs). Each keeps
its own fields; what two of them share is on the handle.
"""

from __future__ import annotations

from aiohttp import web

from elastic_gpu.scheduler.binder import Binder
from elastic_gpu.scheduler.handle import ClaimApi, Handle, PodApi
from elastic_gpu.scheduler.http import AppRoutes, Handler, HttpRoutes
from elastic_gpu.scheduler.leadership import Role
from elastic_gpu.scheduler.metrics import Metrics
from elastic_gpu.scheduler.provisioner import Provisioner
from elastic_gpu.scheduler.state import SchedulerState
from elastic_gpu.scheduler.verbs import Verbs


def default_metrics(state: SchedulerState) -> Metrics:
    """The extender's metrics, each gauge reading the state when scraped."""
    return Metrics(state.card_usage, state.host_usage, state.workload_size, state.wakeup_stats,
                   state.egpu_holds, state.cards, state.pod_shares, state.distrusted)


class Extender:
    """The whole extender: serve `app()`; `drained()` on shutdown. `role`: whether this
    replica answers the verbs (leader election; without it, always)."""

    def __init__(self, state: SchedulerState, api: PodApi | None = None,
                 metrics: Metrics | None = None, bind_budget_s: float = 4.0,
                 claims_api: ClaimApi | None = None, role: Role | None = None) -> None:
        self.handle = Handle(state, api, claims_api, metrics or default_metrics(state),
                             role or Role())
        self.verbs = Verbs(self.handle)
        self.binder = Binder(self.handle, self.verbs.recent, bind_budget_s)
        self.provisioner = Provisioner(self.handle)
        self.routes = HttpRoutes(self.handle)
        # the verbs, as `app()` routes them (read there: a test may wrap one before)
        self.filter = self.verbs.filter
        self.prioritize = self.verbs.prioritize
        self.preempt = self.verbs.preempt
        self.bind = self.binder.bind
        self.provision = self.provisioner.provision
        self.healthz = self.routes.healthz
        self.readyz = self.routes.readyz

    @property
    def state(self) -> SchedulerState:
        return self.handle.state

    @property
    def metrics(self) -> Metrics:
        return self.handle.metrics

    @property
    def role(self) -> Role:
        return self.handle.role

    def _verbs(self) -> dict[str, Handler]:
        return {"filter": self.filter, "prioritize": self.prioritize, "bind": self.bind,
                "preempt": self.preempt, "provision": self.provision}

    def app(self, prefix: str = "") -> web.Application:
        return self.routes.app(self._verbs(), prefix)

    def http_app(self, prefix: str = "") -> AppRoutes:
        """The same routes for the gate's own protocol servers (HTTP/1.1, and HTTP/2 where
        TLS negotiates it): what `egpu scheduler` serves."""
        return self.routes.http_app(self._verbs(), prefix)

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no bind is in progress (at most `timeout_s`); False if some still are."""
        return await self.handle.binds.drained(timeout_s)
