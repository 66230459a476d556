"""HAMi's (and Volcano's) annotations, KAI's and Koordinator's dialects, through admission."""

from __future__ import annotations

from typing import Any

import pytest
from peer_helpers import FACTS, asked, pod, refusal, stored

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.request import RequestKind, pod_request_from_manifest

HAMI_SHARE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}


def annotations_of(p: dict[str, Any], facts: ClusterFacts = FACTS) -> dict[str, str]:
    out: dict[str, str] = stored(p, facts)["metadata"].get("annotations") or {}
    return out


def test_card_types_expand_to_the_clusters_models_as_hami_matches_them() -> None:
    got = annotations_of(pod(HAMI_SHARE, {"nvidia.com/use-gputype": "a100,V100"}))
    assert got[ann.GPU_MODEL_ALLOW] == "A100-SXM4-80GB"
    got = annotations_of(pod(HAMI_SHARE, {"nvidia.com/nouse-gputype": "1080,t4"}))
    assert got[ann.GPU_MODEL_DENY] == "T4"
    assert ann.GPU_MODEL_DENY not in annotations_of(
        pod(HAMI_SHARE, {"nvidia.com/nouse-gputype": "1080,2080"}))


def test_a_card_type_the_cluster_lacks_is_refused_naming_it() -> None:
    message = refusal(pod(HAMI_SHARE, {"nvidia.com/use-gputype": "H100"}))
    assert "nvidia.com/use-gputype=H100: names no card model of the cluster" in message


def test_card_uuids_are_pinned_and_a_list_naming_no_card_is_refused() -> None:
    facts = ClusterFacts(smallest_card_memory_mib=1000, largest_card_memory_mib=1000,
                         card_uuids=frozenset({"GPU-a", "GPU-b"}))
    p = pod(HAMI_SHARE, {"nvidia.com/use-gpuuuid": "GPU-a, GPU-z",
                         "volcano.sh/vgpu-nouse-gpuuuid": "GPU-b"})
    request = pod_request_from_manifest(stored(p, facts))
    assert request.allowed_cards == {"GPU-a", "GPU-z"} and request.denied_cards == {"GPU-b"}
    message = refusal(pod(HAMI_SHARE, {"nvidia.com/use-gpuuuid": "GPU-z"}), facts)
    assert "nvidia.com/use-gpuuuid=GPU-z: names no card of the cluster" in message


def test_scheduling_policies_map_to_ours() -> None:
    got = annotations_of(pod(HAMI_SHARE, {"hami.io/node-scheduler-policy": "spread",
                                          "hami.io/gpu-scheduler-policy": "binpack"}))
    assert (got[ann.NODE_POLICY], got[ann.CARD_POLICY]) == ("spread", "binpack")
    assert "hami.io/gpu-scheduler-policy=mutex" in refusal(
        pod(HAMI_SHARE, {"hami.io/gpu-scheduler-policy": "mutex"}))


def test_dynamic_mig_mode_asks_the_smallest_profile_with_the_memory() -> None:
    """HAMi's `vgpu-mode: mig` (its dynamic_mig_example.yaml): 2 x 8000 MiB is two 1g.10gb
    instances on the cluster's A100 80 GB, kept to that model; memory in percent (or none) and
    more than any profile holds are refused naming the field."""
    got = stored(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 8000},
                     {"nvidia.com/vgpu-mode": "mig"}))
    limits = got["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "2"
    assert not {"nvidia.com/gpu", "nvidia.com/gpumem"} & set(limits)
    assert got["metadata"]["annotations"][ann.GPU_MODEL_ALLOW] == "A100-SXM4-80GB"
    # HAMi's N devices are N cards: the two instances go on two distinct cards
    assert got["metadata"]["annotations"][ann.MIG_DISTINCT_CARDS] == "true"
    request = pod_request_from_manifest(got)
    assert request.containers[0].kind is RequestKind.MIG and request.containers[0].cards == 2
    assert request.containers[0].distinct
    one = stored(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000},
                     {"nvidia.com/vgpu-mode": "mig"}))
    assert ann.MIG_DISTINCT_CARDS not in one["metadata"]["annotations"]
    # our own name keeps its meaning: any cards
    ours = stored(pod({"nvidia.com/mig-1g.10gb": 2}))
    assert not pod_request_from_manifest(ours).containers[0].distinct
    assert "give nvidia.com/gpumem in MiB" in refusal(
        pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},
            {"nvidia.com/vgpu-mode": "mig"}))
    assert "holds 90000 MiB" in refusal(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 90000},
                                            {"volcano.sh/vgpu-mode": "mig"}))


def test_kai_fraction_and_memory() -> None:
    p = pod({}, {"gpu-fraction": "0.5"}, scheduler="kai-scheduler")
    assert asked(p)[0] is RequestKind.SHARE and asked(p)[3] == 8192
    p = pod({}, {"gpu-memory": "2000", "gpu-fraction-num-devices": "1"}, scheduler="kai-scheduler")
    assert (asked(p)[1], asked(p)[3]) == (1, 2000)
    assert asked(pod({}, {"gpu-fraction": "1"}, scheduler="kai-scheduler"))[:2] == (
        RequestKind.WHOLE, 1)
    del p["spec"]["containers"][0]["resources"]
    assert asked(p)[3] == 2000  # a container without resources gets them


def test_kai_annotations_on_a_pod_of_another_scheduler_mean_nothing() -> None:
    p = pod({}, {"gpu-fraction": "0.5"})
    assert stored(p) == p


@pytest.mark.parametrize(("annotations", "text"), [
    ({"gpu-fraction": "1.5"}, "gpu-fraction=1.5"),
    ({"gpu-fraction": "0.5", "gpu-memory": "10"}, "gpu-fraction, gpu-memory"),
    ({"gpu-memory": "999999"}, "gpu-memory=999999"),
    ({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"},
     "gpu-fraction-container-name=nope"),
])
def test_kai_refusals(annotations: dict[str, str], text: str) -> None:
    assert text in refusal(pod({}, annotations, scheduler="kai-scheduler"))


def test_koordinator_resources() -> None:
    assert asked(pod({"koordinator.sh/gpu.shared": 1, "koordinator.sh/gpu-core": 50,
                      "koordinator.sh/gpu-memory-ratio": 50})) == (RequestKind.SHARE, 1, 500, 8192)
    assert asked(pod({"koordinator.sh/gpu-core": 20, "koordinator.sh/gpu-memory": "4Gi"})) == (
        RequestKind.SHARE, 1, 200, 4096)
    assert asked(pod({"koordinator.sh/gpu": 25}))[2:] == (250, 4096)
    # totals over gpu.shared cards (the proposal's example); a ratio of 200 is 2 cards
    assert asked(pod({"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory": "4Gi",
                      "koordinator.sh/gpu.shared": 2})) == (RequestKind.SHARE, 2, 500, 2048)
    assert asked(pod({"koordinator.sh/gpu-core": 200,
                      "koordinator.sh/gpu-memory-ratio": 200}))[:2] == (RequestKind.WHOLE, 2)


@pytest.mark.parametrize(("limits", "text"), [
    ({"koordinator.sh/gpu-core": 150, "koordinator.sh/gpu-memory-ratio": 50},
     "koordinator.sh/gpu-core=150"),
    ({"koordinator.sh/gpu-core": 25, "koordinator.sh/gpu-memory-ratio": 50,
      "koordinator.sh/gpu.shared": 2}, "koordinator.sh/gpu-core=25"),
    ({"koordinator.sh/gpu-memory": "1Gi", "koordinator.sh/gpu-memory-ratio": 10},
     "koordinator.sh/gpu-memory, koordinator.sh/gpu-memory-ratio"),
    ({"koordinator.sh/gpu-memory": "100Gi"}, "koordinator.sh/gpu-memory=100Gi"),
    ({"koordinator.sh/gpu-core": 10}, "a share names its memory"),
    ({"koordinator.sh/gpu.shared": 0, "koordinator.sh/gpu-core": 10},
     "koordinator.sh/gpu.shared=0"),
])
def test_koordinator_refusals(limits: dict[str, Any], text: str) -> None:
    assert text in refusal(pod(limits))
