"""The webhook's copy of the MIG adapter's rules: a list and watch of MIGSubstitutions.

`core.admission.mig_substitution` rewrites the pods a rule selects; it reads the rules from
`ClusterFacts.mig_substitutions`, which `WebhookServer` refreshes from this cache on every
change. While the CRD is not installed (404 on the list) there are no rules and the list is
retried every `crd_retry_s`, like the claim cache (docs/mig-adapter.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from elastic_gpu.core.mig import SubstitutionRule

log = logging.getLogger(__name__)


def rule_resource() -> Any:
    """lightkube's generic resource for MIGSubstitutions (namespaced)."""
    from lightkube.generic_resource import create_namespaced_resource

    from elastic_gpu.k8s.elasticgpu import GROUP, VERSION
    from elastic_gpu.k8s.migsubstitution import KIND, PLURAL

    return create_namespaced_resource(GROUP, VERSION, KIND, PLURAL)


def _rule(obj: Mapping[str, Any]) -> SubstitutionRule | None:
    from elastic_gpu.k8s.elasticgpu import ElasticGPUObjectError
    from elastic_gpu.k8s.migsubstitution import rule_from_object

    try:
        return rule_from_object(obj)
    except ElasticGPUObjectError as err:
        log.warning("MIGSubstitution not read: %s", err)
        return None


class RuleCache:
    """MIGSubstitutions by (namespace, name); `on_change(rules)` runs after each change."""

    def __init__(self, on_change: Callable[[tuple[SubstitutionRule, ...]], None] = lambda _: None,
                 crd_retry_s: float = 10.0) -> None:
        self.rules: dict[tuple[str, str], SubstitutionRule] = {}
        self.synced = asyncio.Event()
        self.crd_retry_s = crd_retry_s
        self._on_change = on_change

    def snapshot(self) -> tuple[SubstitutionRule, ...]:
        return tuple(self.rules[k] for k in sorted(self.rules))

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        rules = {}
        for item in items:
            rule = _rule(item)
            if rule is not None:
                rules[(rule.namespace, rule.name)] = rule
        self.rules = rules
        self._on_change(self.snapshot())

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        rule = None if kind == "DELETED" else _rule(obj)
        if rule is None:
            if self.rules.pop(key, None) is None:
                return
        else:
            self.rules[key] = rule
        self._on_change(self.snapshot())

    async def run(self, client: Any) -> None:
        """List, then watch from the list's version; on an error list again after a second,
        or after `crd_retry_s` while the CRD is not installed."""
        from lightkube.core.exceptions import ApiError

        resource = rule_resource()
        while True:
            try:
                listing = client.list(resource, namespace="*")
                items = [rule.to_dict() async for rule in listing]
                self.replace(items)
                self.synced.set()
                async for kind, rule in client.watch(resource, namespace="*",
                                                     resource_version=listing.resourceVersion):
                    self.event(str(kind), rule.to_dict())
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if getattr(getattr(err, "status", None), "code", None) == 404:
                    if self.rules:
                        self.rules = {}
                        self._on_change(())
                    self.synced.set()
                    await asyncio.sleep(self.crd_retry_s)
                else:
                    log.warning("MIGSubstitution watch: %s; listing again in 1 s", err)
                    await asyncio.sleep(1.0)
            except Exception as err:  # the API is down or the watch expired: list again
                log.warning("MIGSubstitution watch: %s; listing again in 1 s", err)
                await asyncio.sleep(1.0)
