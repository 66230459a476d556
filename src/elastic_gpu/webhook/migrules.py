"""The webhook's copy of the MIG adapter's rules: an informer on MIGSubstitutions.

`core.admission.mutators.mig.mig_substitution` rewrites the pods a rule selects; it reads the rules from
`ClusterFacts.mig_substitutions`, which `WebhookServer` refreshes from this cache on every
change. While the CRD is not installed (404 on the list) there are no rules and the list is
retried every `crd_retry_s`: `webhook.cluster.CrdCache`, as the claim cache (docs/mig-adapter.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from elastic_gpu.core.mig.rules import SubstitutionRule
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.informer import ListWatcher
from elastic_gpu.kube.resources import MIG_SUBSTITUTIONS as RULES
from elastic_gpu.webhook.cluster import CrdCache, Key

log = logging.getLogger(__name__)


def _rule(obj: Mapping[str, Any]) -> SubstitutionRule | None:
    from elastic_gpu.api.migsubstitution import MIGSubstitutionError, rule_from_object

    try:
        return rule_from_object(obj)
    except MIGSubstitutionError as err:
        log.warning("MIGSubstitution not read: %s", err)
        return None


class RuleCache(CrdCache[SubstitutionRule]):
    """MIGSubstitutions by (namespace, name); `on_change(rules)` runs after each change."""

    kind = "MIGSubstitution"

    def __init__(self, on_change: Callable[[tuple[SubstitutionRule, ...]], None] = lambda _: None,
                 crd_retry_s: float = 10.0) -> None:
        super().__init__(RULES, _rule, crd_retry_s)
        self._notify = on_change
        self.client: Any = None
        #: the live lists' client (`kube.client.KubeClient`); None: the cache's rules
        self.reader: Any = None
        #: live lists made (one per MIG pod at /mutate)
        self.fetches = 0

    async def fetch(self, namespace: str) -> tuple[SubstitutionRule, ...]:
        """The namespace's rules as the API has them now (a list without resourceVersion: a
        quorum read, so every rule created before this call is in it). No reader, or the
        CRD not installed: the cache's. Other API errors are raised (the caller falls back to
        the cache)."""
        if self.reader is None:
            return tuple(r for r in self.snapshot() if r.namespace == namespace)
        path = RULES.path(namespace)  # the namespace checked and escaped (kube.paths)
        self.fetches += 1
        try:
            items, _ = await self.reader.list(path)
        except NotFound:
            return ()
        found = (_rule(item) for item in items)
        return tuple(sorted((r for r in found if r is not None), key=lambda r: r.name))

    async def run(self, client: ListWatcher) -> None:
        self.client = client
        await super().run(client)

    @property
    def rules(self) -> dict[Key, SubstitutionRule]:
        return self.objects

    def snapshot(self) -> tuple[SubstitutionRule, ...]:
        return tuple(self.objects[k] for k in sorted(self.objects))

    def on_change(self) -> None:
        self._notify(self.snapshot())
