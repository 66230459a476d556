"""The parts of a pod manifest (a plain dict, as an AdmissionReview carries it) that the
rules, the claim plan and the mutators read, read one way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_containers(pod: Mapping[str, Any], field_name: str) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return list(spec.get(field_name) or [])


def pod_namespace(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def owner_uids(pod: Mapping[str, Any]) -> list[str]:
    refs = (pod.get("metadata") or {}).get("ownerReferences")
    if not isinstance(refs, list):
        return []
    return [str(r["uid"]) for r in refs if isinstance(r, Mapping) and isinstance(r.get("uid"), str)]
