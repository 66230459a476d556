"""HAMi's (and Volcano's) pod annotations, read as ours.

- `nvidia.com/use-gputype` / `nouse-gputype`: card types, matched as HAMi matches them (a
  case-insensitive substring of the card's model: `A100` is every A100), expanded here to the
  models the cluster has and written as `elasticgpu.io/gpu-model` / `gpu-model-deny`;
- `nvidia.com/use-gpuuuid` / `nouse-gpuuuid` (Volcano: `volcano.sh/vgpu-use-gpuuuid` /
  `vgpu-nouse-gpuuuid`): card UUIDs, written as `elasticgpu.io/gpu-uuid` /
  `gpu-uuid-deny`, which the engine honours per card (`PodRequest.accepts_card`);
- `hami.io/node-scheduler-policy` / `gpu-scheduler-policy` (binpack, spread) as our node and
  card policies of those names;
- `nvidia.com/vgpu-mode` / `volcano.sh/vgpu-mode`: `hami-core` is what our shares are;
  `mig` (HAMi's dynamic MIG) is served by ours: the containers' requests become MIG
  profiles (`core.peers.hami_mig`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.peers import PeerFacts, PeerRefusal, Translation

USE_TYPE = "nvidia.com/use-gputype"
NOUSE_TYPE = "nvidia.com/nouse-gputype"
USE_UUID = ("nvidia.com/use-gpuuuid", "volcano.sh/vgpu-use-gpuuuid")
NOUSE_UUID = ("nvidia.com/nouse-gpuuuid", "volcano.sh/vgpu-nouse-gpuuuid")
NODE_POLICY = "hami.io/node-scheduler-policy"
CARD_POLICY = "hami.io/gpu-scheduler-policy"
VGPU_MODE = ("nvidia.com/vgpu-mode", "volcano.sh/vgpu-mode")
#: HAMi's policy names and ours
POLICIES = {"binpack": "binpack", "spread": "spread"}

PEER_ANNOTATIONS = (USE_TYPE, NOUSE_TYPE, *USE_UUID, *NOUSE_UUID, NODE_POLICY, CARD_POLICY,
                    *VGPU_MODE)


def _items(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def matching_models(types: Iterable[str], models: Iterable[str]) -> list[str]:
    """The models some type names, as HAMi matches (`CheckType`: case-insensitive substring)."""
    wanted = [t.upper() for t in types]
    return sorted(m for m in models if any(t in m.upper() for t in wanted))


def hami_annotations(annotations: Mapping[str, str], facts: PeerFacts) -> Translation:
    """Our annotations for HAMi's (and Volcano's), or the refusals naming HAMi's key."""
    out: dict[str, str] = {}
    refusals: list[PeerRefusal] = []
    for key, ours in ((USE_TYPE, ann.GPU_MODEL_ALLOW), (NOUSE_TYPE, ann.GPU_MODEL_DENY)):
        types = _items(str(annotations.get(key, "")))
        if not types:
            continue
        found = matching_models(types, facts.models)
        if ours in annotations:
            if annotations[ours] != "|".join(found):  # not our own earlier translation
                refusals.append(PeerRefusal(key, str(annotations[key]),
                                            f"give {key} or {ours}, not both"))
            continue
        if found:
            out[ours] = "|".join(found)
        elif key == USE_TYPE and facts.models:
            refusals.append(PeerRefusal(key, str(annotations[key]),
                                        f"names no card model of the cluster (it has "
                                        f"{', '.join(sorted(facts.models))})"))
    for keys, ours in ((USE_UUID, ann.GPU_UUID_ALLOW), (NOUSE_UUID, ann.GPU_UUID_DENY)):
        for key in keys:
            uuids = _items(str(annotations.get(key, "")))
            if not uuids:
                continue
            if (keys is USE_UUID and facts.card_uuids is not None
                    and not set(uuids) & facts.card_uuids):
                refusals.append(PeerRefusal(key, str(annotations[key]),
                                            "names no card of the cluster"))
                continue
            out[ours] = ",".join(uuids)
    for key, ours in ((NODE_POLICY, ann.NODE_POLICY), (CARD_POLICY, ann.CARD_POLICY)):
        if key not in annotations or ours in annotations:
            continue
        value = str(annotations[key]).strip()
        if value not in POLICIES:
            refusals.append(PeerRefusal(key, value, f"is one of {', '.join(sorted(POLICIES))}"))
            continue
        out[ours] = POLICIES[value]
    return Translation(annotations=out, refusals=tuple(refusals))
