"""HAMi's dynamic MIG (`nvidia.com/vgpu-mode: mig`, `volcano.sh/vgpu-mode: mig`), served by
ours (issue 42): a container's vGPU request of N cards with M MiB each becomes
`nvidia.com/mig-<profile>: N`, the profile the smallest one with at least M MiB
(`core.mig.profiles.smallest_profile_for_memory`) on the cluster's MIG models, on N distinct
cards as HAMi gives them (`elasticgpu.io/mig-distinct-cards: "true"` when N > 1). The mig-dynamic
controller then carves it where no free instance has it (docs/mig-apply.md).

Profile names are per model (8000 MiB is a `1g.10gb` on an A100 80 GB, a `2g.10gb` on an A100
40 GB): the first MIG model of the cluster in name order decides, and the pod is kept to the
models where that profile is the answer (`elasticgpu.io/gpu-model`). Memory in percent, or
none, is refused: a MIG profile is sized by memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.mig.profiles import mig_model, smallest_profile_for_memory
from elastic_gpu.core.peers import PeerFacts, PeerRefusal, Rewrite, merged_resources, whole_number
from elastic_gpu.core.peers.vgpu import Vocabulary

VGPU_MODE = ("nvidia.com/vgpu-mode", "volcano.sh/vgpu-mode")


def wants_mig(annotations: Mapping[str, Any]) -> bool:
    """The pod asks HAMi's (or Volcano's) dynamic MIG mode."""
    return any(str(annotations.get(key, "")).strip().lower() == "mig" for key in VGPU_MODE)


def mig_rewrite(vocab: Vocabulary, name: str, container: Mapping[str, Any], facts: PeerFacts
                ) -> tuple[Rewrite, dict[str, str]] | list[PeerRefusal] | None:
    """One container's vGPU request in `vocab` as MIG instances, and the annotations that keep
    the pod to the models where that profile is the answer; None: it asks no vGPU."""
    values = merged_resources(container)
    written = [n for n in vocab.names if n in values]
    if not written:
        return None
    cards = whole_number(vocab.count, values.get(vocab.count, 1), name, least=1, most=7)
    if isinstance(cards, PeerRefusal):
        return [cards]
    if vocab.memory not in values:
        return [PeerRefusal(vocab.percentage if vocab.percentage in values else vocab.count,
                            str(values.get(vocab.percentage, values.get(vocab.count, ""))),
                            f"vgpu-mode mig sizes each instance by its memory: give "
                            f"{vocab.memory} in MiB", name)]
    mib = whole_number(vocab.memory, values[vocab.memory], name, least=1)
    if isinstance(mib, PeerRefusal):
        return [mib]
    answers = {m: smallest_profile_for_memory(mib, m) for m in sorted(facts.models)
               if mig_model(m) is not None}
    found = {m: p for m, p in answers.items() if p is not None}
    if not found:
        known = ", ".join(sorted(facts.models)) or "none known yet"
        return [PeerRefusal(vocab.memory, str(values[vocab.memory]),
                            f"no MIG profile of the cluster's card models ({known}) holds "
                            f"{mib} MiB", name)]
    profile = next(iter(found.values()))
    models = sorted(m for m, p in found.items() if p == profile)
    keep = {ann.GPU_MODEL_ALLOW: "|".join(models)}
    if cards > 1:  # HAMi's N devices are N cards: one instance on each
        keep[ann.MIG_DISTINCT_CARDS] = "true"
    return Rewrite(name, tuple(written), {profile.resource_name: str(cards)}), keep
