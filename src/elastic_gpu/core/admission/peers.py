"""Peers' dialects at create: a HAMi, Volcano, KAI or Koordinator pod is rewritten into ours
before the admission rules read it (`core.peers`), so the rules, the mutators, the scheduler,
the agent, quota and budgets see only our names. A value we cannot honour is a refusal naming
the peer's field (rule `peer-field`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.admission.jsonpatch import PatchOp, pointer, set_annotation
from elastic_gpu.core.admission.rules import AdmissionRule, Refusal
from elastic_gpu.core.peers import PeerFacts, PeerRefusal, Rewrite, Translation
from elastic_gpu.core.peers.hami import hami_annotations
from elastic_gpu.core.peers.hami_mig import mig_rewrite, wants_mig
from elastic_gpu.core.peers.kai import kai_translation
from elastic_gpu.core.peers.koordinator import koordinator_rewrite
from elastic_gpu.core.peers.vgpu import VOCABULARIES, vgpu_rewrite
from elastic_gpu.core.request import SpecContainer, lifetime_containers


def peer_facts(facts: ClusterFacts) -> PeerFacts:
    return PeerFacts(facts.smallest_card_memory_mib, facts.largest_card_memory_mib,
                     facts.models, facts.card_uuids)


def translate(pod: Mapping[str, Any], facts: ClusterFacts) -> Translation:
    """Every peer dialect's translation of `pod`."""
    known = peer_facts(facts)
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    out = hami_annotations(annotations or {}, known) + kai_translation(pod, known)
    mig = wants_mig(annotations or {})
    for item in lifetime_containers(pod):
        if mig:
            out += _mig_translation(item.name, item.container, known)
            continue
        found = [vgpu_rewrite(v, item.name, item.container, known) for v in VOCABULARIES]
        found.append(koordinator_rewrite(item.name, item.container, known))
        for got in found:
            if isinstance(got, list):
                out += Translation(refusals=tuple(got))
            elif got is not None:
                out += Translation(rewrites=(got,))
    return out


def _mig_translation(name: str, container: Mapping[str, Any], facts: PeerFacts) -> Translation:
    """HAMi's dynamic MIG mode: the container's vGPU request as MIG instances."""
    out = Translation()
    for vocab in VOCABULARIES:
        got = mig_rewrite(vocab, name, container, facts)
        if isinstance(got, list):
            out += Translation(refusals=tuple(got))
        elif got is not None:
            out += Translation(rewrites=(got[0],), annotations=got[1])
    return out


def _container_ops(item: SpecContainer, rewrite: Rewrite) -> list[PatchOp]:
    ops: list[PatchOp] = []
    base = ("spec", item.field, item.index, "resources")
    resources = item.container.get("resources")
    if not isinstance(resources, Mapping):
        return [{"op": "add", "path": pointer(*base), "value": {"limits": dict(rewrite.add)}}]
    touched = False
    for part in ("limits", "requests"):
        values = resources.get(part)
        if not isinstance(values, Mapping):
            continue
        had = [n for n in rewrite.remove if n in values]
        ops += [{"op": "remove", "path": pointer(*base, part, n)} for n in had]
        if part == "limits" or had:
            touched = touched or part == "limits"
            ops += [{"op": "add", "path": pointer(*base, part, k), "value": v}
                    for k, v in rewrite.add.items()]
    if not touched and rewrite.add:
        ops.append({"op": "add", "path": pointer(*base, "limits"), "value": dict(rewrite.add)})
    return ops


def peer_ops(pod: Mapping[str, Any], translation: Translation) -> list[PatchOp]:
    """The JSON Patch that writes `translation` into `pod` (empty when it is ours already)."""
    ops: list[PatchOp] = []
    by_name = {item.name: item for item in lifetime_containers(pod)}
    for rewrite in translation.rewrites:
        item = by_name.get(rewrite.container)
        if item is not None:
            ops += _container_ops(item, rewrite)
    current = dict((pod.get("metadata") or {}).get("annotations") or {})
    for key, value in translation.annotations.items():
        if current.get(key) != value:
            ops.append(set_annotation({"metadata": {"annotations": current or None}}, key, value))
            current[key] = value
    return ops


def peer_refusals(translation: Translation) -> list[Refusal]:
    return [_refusal(r) for r in translation.refusals]


def _refusal(r: PeerRefusal) -> Refusal:
    return Refusal(AdmissionRule.PEER_FIELD, r.field, r.value, r.detail, r.container)
