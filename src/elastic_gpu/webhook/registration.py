"""The webhook's registration: a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration
(admissionregistration.k8s.io/v1), as plain dicts. Pure.

Scope, so that an outage of the webhook cannot block what it does not govern:
- `rules`: pods, CREATE only (a pod's resources cannot change after creation but by the resize
  subresource, which is not sent);
- `namespaceSelector`: never kube-system nor the webhook's own namespace, and no namespace
  labelled `elasticgpu.io/admission: ignore`;
- `objectSelector`: no pod labelled `elasticgpu.io/admission: ignore` (the opt-out);
- `matchConditions` (CEL): only pods that name a GPU resource of the resource table or of a
  peer's dialect (limits or requests, containers or init containers), carry an
  `egpuc.elasticgpu.io/*` claim annotation, are KAI pods with its sharing annotations, or name
  ResourceClaims (the DRA placement gate, the rules, quota and budget of claims: docs/dra.md).
What it governs fails closed (`failurePolicy: Fail`): a GPU pod that skipped admission would
run without its rules. `timeoutSeconds` is short, `reinvocationPolicy: IfNeeded`.

A second mutating webhook, `elasticgpuclaims.mutate.elasticgpu.io`, gives every
ElasticGPUClaim the claim-protection finalizer at CREATE (issue #26, as kube-apiserver's
StorageObjectInUseProtection plugin does for PVCs): in every namespace (only `namespace_labels`
narrows it, for tests sharing a cluster), no opt-out, failing closed. A claim is useless
without the webhook anyway (a pod naming one is refused while it is down), and a claim without
the finalizer is one that can vanish under its pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic_gpu.api.elasticgpu import CLAIM_PLURAL, GROUP
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.rules import OPT_OUT_LABEL, OPT_OUT_VALUE
from elastic_gpu.core.peers import kai, koordinator, vgpu
from elastic_gpu.core.resources import MIG_PREFIX, RESOURCE_TABLE

#: Resource names of the peers' dialects (`core.peers`): the webhook rewrites them into ours.
PEER_NAMES = (*vgpu.PEER_RESOURCE_NAMES, *koordinator.PEER_RESOURCE_NAMES)

MUTATE_PATH = "/mutate"
VALIDATE_PATH = "/validate"
CLAIM_MUTATE_PATH = "/mutate-claims"
MUTATING_WEBHOOK = "pods.mutate.elasticgpu.io"
VALIDATING_WEBHOOK = "pods.validate.elasticgpu.io"
CLAIM_MUTATING_WEBHOOK = "elasticgpuclaims.mutate.elasticgpu.io"
DEFAULT_NAME = "elastic-gpu-webhook"


@dataclass(frozen=True)
class Target:
    """Where kube-apiserver calls the webhook: a `url` (the dev cluster: https on loopback) or
    a Service in the cluster."""

    url: str | None = None
    service_name: str | None = None
    service_namespace: str | None = None
    service_port: int = 443

    def client_config(self, path: str, ca_bundle_b64: str) -> dict[str, Any]:
        config: dict[str, Any] = {"caBundle": ca_bundle_b64}
        if self.url is not None:
            config["url"] = self.url.rstrip("/") + path
        else:
            config["service"] = {"name": self.service_name, "namespace": self.service_namespace,
                                 "path": path, "port": self.service_port}
        return config


@dataclass(frozen=True)
class Scope:
    #: the webhook's own namespace, never sent
    namespace: str
    timeout_s: int = 5
    #: only namespaces with these labels (e.g. tests sharing one cluster); empty: all
    namespace_labels: Mapping[str, str] = field(default_factory=dict)


def _gpu_key_condition(var: str) -> str:
    names = ", ".join(f"'{name}'" for name in (*(s.name for s in RESOURCE_TABLE), *PEER_NAMES))
    return f"({var} in [{names}] || {var}.startsWith('{MIG_PREFIX}'))"


def _container_condition(container: str) -> str:
    key = _gpu_key_condition("k")
    return (f"has({container}.resources) && ("
            f"(has({container}.resources.limits) && {container}.resources.limits.exists(k, {key}))"
            f" || (has({container}.resources.requests) && "
            f"{container}.resources.requests.exists(k, {key})))")


def match_expression() -> str:
    """CEL: the pod names a GPU resource (ours or a peer's), carries a claim annotation, is a
    KAI pod asking a share by annotation (`core.peers.kai`), or names ResourceClaims."""
    return " || ".join([
        f"object.spec.containers.exists(c, {_container_condition('c')})",
        f"(has(object.spec.initContainers) && object.spec.initContainers.exists(c, "
        f"{_container_condition('c')}))",
        f"(has(object.metadata.annotations) && object.metadata.annotations.exists(k, "
        f"k.startsWith('{ann.CLAIM_PREFIX}')))",
        f"(has(object.spec.schedulerName) && object.spec.schedulerName == '{kai.SCHEDULER}' && "
        f"has(object.metadata.annotations) && object.metadata.annotations.exists(k, "
        f"k in ['{kai.FRACTION}', '{kai.MEMORY}']))",
        # ResourceClaims: read for the DRA placement gate, rules, quota and budget (`draclaims`)
        "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)",
    ])


def _webhook(name: str, path: str, target: Target, ca_bundle_b64: str,
             scope: Scope) -> dict[str, Any]:
    namespace_selector: dict[str, Any] = {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": sorted({"kube-system", scope.namespace})},
        {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": [OPT_OUT_VALUE]},
    ]}
    if scope.namespace_labels:
        namespace_selector["matchLabels"] = dict(scope.namespace_labels)
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": scope.timeout_s,
        "clientConfig": target.client_config(path, ca_bundle_b64),
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["pods"], "scope": "Namespaced"}],
        "namespaceSelector": namespace_selector,
        "objectSelector": {"matchExpressions": [
            {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": [OPT_OUT_VALUE]}]},
        "matchConditions": [{"name": "gpu-pod-or-claim", "expression": match_expression()}],
    }


def _claim_webhook(target: Target, ca_bundle_b64: str, scope: Scope) -> dict[str, Any]:
    """ElasticGPUClaims at CREATE get the claim-protection finalizer."""
    hook: dict[str, Any] = {
        "name": CLAIM_MUTATING_WEBHOOK,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": scope.timeout_s,
        "clientConfig": target.client_config(CLAIM_MUTATE_PATH, ca_bundle_b64),
        "rules": [{"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE"],
                   "resources": [CLAIM_PLURAL], "scope": "Namespaced"}],
        "reinvocationPolicy": "Never",
    }
    if scope.namespace_labels:
        hook["namespaceSelector"] = {"matchLabels": dict(scope.namespace_labels)}
    return hook


def configurations(name: str, target: Target, ca_bundle_b64: str,
                   scope: Scope) -> tuple[dict[str, Any], dict[str, Any]]:
    """(MutatingWebhookConfiguration, ValidatingWebhookConfiguration) named `name`."""
    labels = {"app.kubernetes.io/name": "elastic-gpu-webhook",
              "app.kubernetes.io/part-of": "elastic-gpu"}
    mutating_hook = _webhook(MUTATING_WEBHOOK, MUTATE_PATH, target, ca_bundle_b64, scope)
    mutating_hook["reinvocationPolicy"] = "IfNeeded"
    mutating = {"apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": name, "labels": labels},
                "webhooks": [mutating_hook, _claim_webhook(target, ca_bundle_b64, scope)]}
    validating = {"apiVersion": "admissionregistration.k8s.io/v1",
                  "kind": "ValidatingWebhookConfiguration",
                  "metadata": {"name": name, "labels": labels},
                  "webhooks": [_webhook(VALIDATING_WEBHOOK, VALIDATE_PATH, target, ca_bundle_b64,
                                        scope)]}
    return mutating, validating
