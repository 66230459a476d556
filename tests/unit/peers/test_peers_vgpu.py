"""HAMi's and Volcano's vGPU resources (`core.peers.vgpu`), through admission: each name and
default read with HAMi's meaning, stored in our names, refused naming the peer's field."""

from __future__ import annotations

from typing import Any

import pytest
from peer_helpers import FACTS, asked, pod, refusal, stored

from elastic_gpu.core.admission.facts import ClusterFacts
from elastic_gpu.core.request import RequestKind


def test_hami_default_example_is_one_share_of_30_percent_and_3000_mib() -> None:
    p = pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})
    limits = stored(p)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "3000",
                      "node.elasticgpu.io/gpu-core": "30"}
    assert asked(p) == (RequestKind.SHARE, 1, 300, 3000)


def test_hami_memory_without_cores_is_a_memory_share() -> None:
    kind, cards, _, mib = asked(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}))
    assert (kind, cards, mib) == (RequestKind.SHARE, 1, 3000)


def test_hami_memory_percentage_is_mib_of_the_smallest_card() -> None:
    assert asked(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 40,
                      "nvidia.com/gpucores": 60})) == (RequestKind.SHARE, 1, 600, 16384 * 40 // 100)


def test_hami_cores_without_memory_take_all_of_the_smallest_cards_memory() -> None:
    assert asked(pod({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50})) == (
        RequestKind.SHARE, 1, 500, 16384)


def test_hami_exclusive_forms_are_whole_cards() -> None:
    for limits in ({"nvidia.com/gpu": 2, "nvidia.com/gpucores": 100,
                    "nvidia.com/gpumem-percentage": 100},
                   {"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 100},
                   {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 100, "nvidia.com/gpumem": 2000}):
        assert asked(pod(limits))[:3] == (RequestKind.WHOLE, 2, 1000)


def test_a_bare_hami_count_stays_the_vendors_whole_cards() -> None:
    p = pod({"nvidia.com/gpu": 2})
    assert stored(p)["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert asked(p)[:2] == (RequestKind.WHOLE, 2)


def test_a_share_name_without_the_count_is_one_card_and_requests_are_rewritten_too() -> None:
    p = pod({"nvidia.com/gpumem": 1000}, requests={"nvidia.com/gpumem": 1000, "cpu": "1"})
    resources = stored(p)["spec"]["containers"][0]["resources"]
    assert resources["requests"]["elasticgpu.io/gpu-memory"] == "1000"
    assert resources["requests"]["cpu"] == "1"
    assert "nvidia.com/gpumem" not in resources["requests"]


def test_hami_priority_is_dropped() -> None:
    p = pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/priority": 0})
    assert "nvidia.com/priority" not in stored(p)["spec"]["containers"][0]["resources"]["limits"]


def test_hami_n_shares_are_written_in_the_multi_card_share_dialect() -> None:
    from elastic_gpu.core.admission.peers import translate

    p = pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 30})
    (rewrite,) = translate(p, FACTS).rewrites
    assert dict(rewrite.add) == {"elasticgpu.io/gpu": "2", "elasticgpu.io/gpu-core": "30",
                                 "elasticgpu.io/gpu-memory": str(16384 // 2)}
    assert asked(p) == (RequestKind.SHARE, 2, 300, 8192)
    # a memory share of several cards names 1 % compute, as the dialect asks a compute share
    assert asked(pod({"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 3000})) == (
        RequestKind.SHARE, 2, 10, 3000)


@pytest.mark.parametrize(("limits", "field"), [
    ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 120}, "nvidia.com/gpucores=120"),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 90000}, "nvidia.com/gpumem=90000"),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100, "nvidia.com/gpumem-percentage": 10},
     "nvidia.com/gpumem, nvidia.com/gpumem-percentage"),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150},
     "nvidia.com/gpumem-percentage=150"),
    ({"nvidia.com/gpu": 0, "nvidia.com/gpumem": 100}, "nvidia.com/gpu=0"),
    ({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": "x"}, "volcano.sh/vgpu-cores=x"),
])
def test_refusals_name_the_peers_field(limits: dict[str, Any], field: str) -> None:
    message = refusal(pod(limits))
    assert f"container main: {field}" in message and "(rule peer-field)" in message


def test_a_percentage_before_any_gpu_node_is_known_is_refused_with_what_to_do() -> None:
    message = refusal(pod({"nvidia.com/gpumem-percentage": 50, "nvidia.com/gpucores": 10}),
                      ClusterFacts())
    assert "give memory in MiB" in message


def test_volcano_vgpu_example() -> None:
    p = pod({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 50,
             "volcano.sh/vgpu-memory": 3000}, {"volcano.sh/vgpu-mode": "hami-core"},
            scheduler="volcano")
    assert asked(p) == (RequestKind.SHARE, 1, 500, 3000)
    assert asked(pod({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory-percentage": 25,
                      "volcano.sh/vgpu-cores": 10}))[3] == 4096
    assert asked(pod({"volcano.sh/vgpu-number": 3}))[:3] == (RequestKind.WHOLE, 3, 1000)
    p = pod({"volcano.sh/vgpu-number": 2})
    assert stored(p)["spec"]["containers"][0]["resources"]["limits"][
        "elasticgpu.io/gpu-core"] == "200"


def test_the_shipped_scheduler_configuration_serves_the_peers_schedulers() -> None:
    from elastic_gpu.scheduler.config import SchedulerConfig
    from elastic_gpu.scheduler.schedconfig import kube_scheduler_config

    profiles = [p["schedulerName"] for p in kube_scheduler_config()["profiles"]]
    assert profiles == ["default-scheduler", "hami-scheduler", "kai-scheduler", "volcano"]
    assert SchedulerConfig().scheduler_names == tuple(profiles)
    assert [p["schedulerName"] for p in kube_scheduler_config(
        scheduler_name="x", peer_schedulers=())["profiles"]] == ["x"]
