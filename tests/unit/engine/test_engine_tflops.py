"""Requests in TFLOPS: one request, a compute share sized per card model (issue 28)."""

from __future__ import annotations

import pytest
from engine_helpers import gpu_node

from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.placement import Engine, Unschedulable
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind, container_request
from elastic_gpu.core.resources import GPU_TFLOPS, ResourceError
from elastic_gpu.core.tflops import PRECISION, TFLOPS_TABLE, card_tflops, share_milli


def tflops_pod(name: str, tflops: int, memory: int = 0, **kw: object) -> PodRequest:
    c = container_request("main", {"limits": {GPU_TFLOPS: str(tflops),
                                              **({"elasticgpu.io/gpu-memory": str(memory)}
                                                 if memory else {})}})
    return PodRequest(name, containers=(c,), cpu_milli=1000, memory_mib=1024,
                      **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("model, tflops", [
    ("T4", 65), ("Tesla T4", 65),
    ("V100", 112), ("V100M16", 112), ("Tesla V100-PCIE-32GB", 112),
    ("Tesla V100-SXM2-16GB", 125), ("Tesla V100S-PCIE-32GB", 130),
    ("A10", 125), ("NVIDIA A10", 125), ("NVIDIA A30", 165),
    ("A100", 312), ("A100-SXM4-80GB", 312), ("NVIDIA A100-PCIE-40GB", 312),
    ("H100", 756), ("NVIDIA H100 PCIe", 756), ("NVIDIA H100 80GB HBM3", 989),
    ("NVIDIA H100 NVL", 835), ("H200", 989), ("NVIDIA H200 NVL", 835),
    ("NVIDIA L4", 121), ("NVIDIA L40", 181), ("NVIDIA L40S", 362),
])
def test_each_model_has_its_dense_fp16_tensor_tflops(model: str, tflops: int) -> None:
    assert card_tflops(model) == tflops


@pytest.mark.parametrize("model", ["P100", "G2", "G3", "NVIDIA A10G", "Tesla K80", "",
                                   "BI-V100", "BI-V150", "MR-V100"])
def test_models_outside_the_table_have_none(model: str) -> None:
    assert card_tflops(model) is None
    assert share_milli(model, 10) is None


def test_the_table_states_its_precision() -> None:
    assert "FP16" in PRECISION and "no sparsity" in PRECISION
    assert all(isinstance(v, int) and v > 0 for v in TFLOPS_TABLE.values())


@pytest.mark.parametrize("model, tflops, milli", [
    ("A100", 100, 321),  # 100 / 312 = 0.3205 -> rounded up: never less than asked
    ("T4", 100, None),  # more than the whole T4 (65)
    ("T4", 65, 1000),  # exactly the card
    ("T4", 13, 200),
    ("NVIDIA H100 80GB HBM3", 100, 102),
    ("A100", 1, 4),
])
def test_share_is_the_rounded_up_fraction_of_the_card(model: str, tflops: int,
                                                      milli: int | None) -> None:
    assert share_milli(model, tflops) == milli


def test_a_tflops_limit_reads_as_a_share_sized_per_card() -> None:
    c = container_request("main", {"limits": {GPU_TFLOPS: "100", "elasticgpu.io/gpu-memory":
                                              "4096"}})
    assert (c.kind, c.cards, c.compute_milli, c.memory_mib, c.tflops) == (
        RequestKind.SHARE, 1, 0, 4096, 100)
    assert (c.milli_on("A100"), c.milli_on("NVIDIA H100 80GB HBM3"), c.milli_on("T4")) == (
        321, 102, None)


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "100m", "4Gi", "ten", True])
def test_malformed_tflops_values_are_refused_with_the_rule(value: object) -> None:
    with pytest.raises(ResourceError) as err:
        container_request("main", {"limits": {GPU_TFLOPS: value}})
    assert GPU_TFLOPS in str(err.value)


@pytest.mark.parametrize("other", [{"elasticgpu.io/gpu-core": "30"}, {"nvidia.com/gpu": "1"},
                                   {"nvidia.com/mig-1g.10gb": "1"}])
def test_tflops_with_another_compute_form_is_refused(other: dict[str, str]) -> None:
    with pytest.raises(ResourceError):
        container_request("main", {"limits": {GPU_TFLOPS: "10", **other}})


def test_the_same_request_gets_the_right_share_on_two_models() -> None:
    engine = Engine([gpu_node("a100", cards=1, model="A100-SXM4-80GB", memory=81920),
                     gpu_node("h100", cards=1, model="NVIDIA H100 80GB HBM3", memory=81920)])
    pod = tflops_pod("p", 100, memory=1024)
    on_a100 = engine.assign(pod, "a100")
    on_h100 = engine.assign(pod, "h100")
    assert [s.milli for s in on_a100.shares()] == [321]
    assert [s.milli for s in on_h100.shares()] == [102]
    engine.allocate("x/a", on_a100, pod)
    assert engine.card_usage("a100") == [(0, 321, 1024)]


def test_a_model_outside_the_table_cannot_take_a_tflops_request() -> None:
    engine = Engine([gpu_node("g2", cards=2, model="G2")])
    failure = engine.filter(tflops_pod("p", 10)).failed["g2"]
    assert failure.kind is FitKind.TFLOPS_UNKNOWN_MODEL
    assert failure.offered == ("G2",) and failure.requested == 10
    assert "no model in the TFLOPS table" in describe(failure)
    with pytest.raises(Unschedulable) as err:
        engine.place(tflops_pod("p", 10))
    assert err.value.category == "model"


def test_more_than_one_card_is_refused_with_the_largest_card() -> None:
    engine = Engine([gpu_node("t4", cards=4, model="T4")])
    failure = engine.filter(tflops_pod("p", 100)).failed["t4"]
    assert failure.kind is FitKind.TFLOPS_ABOVE_CARD
    assert (failure.requested, failure.capacity) == (100, 65)
    assert "share of one card" in describe(failure)


def test_a_tflops_share_goes_only_where_the_model_can_take_it() -> None:
    engine = Engine([gpu_node("t4", cards=1, model="T4"), gpu_node("a100", cards=1,
                                                                  model="A100", memory=81920)])
    assert engine.filter(tflops_pod("p", 100)).feasible == ["a100"]
    assert engine.place(tflops_pod("p", 100)).node == "a100"


def test_a_full_card_refuses_the_tflops_share_as_short_of_compute() -> None:
    engine = Engine([gpu_node("t4", cards=1, model="T4")])
    first = tflops_pod("first", 60)  # 924 milli
    engine.allocate(first.key, engine.place(first), first)
    failure = engine.filter(tflops_pod("second", 13)).failed["t4"]
    assert failure.kind is FitKind.INSUFFICIENT_SHARE
    assert failure.per_card_milli == 200


def test_tflops_in_a_several_container_pod_are_planned_per_card() -> None:
    engine = Engine([gpu_node("a100", cards=2, model="A100", memory=81920)])
    pod = PodRequest("two", containers=(
        ContainerRequest("a", RequestKind.SHARE, 1, 0, 1024, None, (GPU_TFLOPS,), 200),
        ContainerRequest("b", RequestKind.SHARE, 1, 0, 1024, None, (GPU_TFLOPS,), 200)))
    assignment = engine.place(pod)
    assert sorted(s.milli for s in assignment.shares()) == [642, 642]
    assert len({s.index for s in assignment.shares()}) == 2


def test_quota_charges_a_tflops_share_at_the_most_it_can_become() -> None:
    """ResourceQuota's accounting resource must never undercount: before its card is known a
    TFLOPS share counts as on the weakest model that can take it (100 TFLOPS: a V100 PCIe's
    112, 893 milli -> 90%), while the node-level count, a lower bound, stays 0."""
    from elastic_gpu.core.nodefit import node_core
    from elastic_gpu.core.quota import QUOTA_CORE, canonical_resources

    c = container_request("main", {"limits": {GPU_TFLOPS: "100"}})
    assert c.most_milli == 893 and c.total_milli == 0
    assert canonical_resources(c)[QUOTA_CORE] == "90"
    assert node_core(c) == 0
    assert max(m for m in (share_milli(model, 100) for model in TFLOPS_TABLE)
               if m is not None) == 893


def test_only_a_card_that_advertises_tflops_serves_a_tflops_request() -> None:
    """An agent with `resources.tflops: []` offers compute shares but no TFLOPS device: kubelet
    would fail a TFLOPS pod bound there, so the scheduler must not choose that node."""
    from dataclasses import replace

    shares = {"elasticgpu.io/gpu-core": 100, "elasticgpu.io/gpu-memory": 81920}
    plain = gpu_node("shares-only", cards=1, model="A100", memory=81920)
    tflops = gpu_node("with-tflops", cards=1, model="A100", memory=81920)
    engine = Engine([
        replace(plain, cards=tuple(replace(c, offers=shares) for c in plain.cards)),
        replace(tflops, cards=tuple(replace(c, offers={**shares, GPU_TFLOPS: 312})
                                    for c in tflops.cards))])
    result = engine.filter(tflops_pod("p", 100))
    assert result.feasible == ["with-tflops"]
    assert GPU_TFLOPS in describe(result.failed["shares-only"])
    # a model outside the table advertises no TFLOPS either: that is the reason given
    g2 = gpu_node("g2", cards=1, model="G2")
    on_g2 = Engine([replace(g2, cards=tuple(replace(c, offers=shares) for c in g2.cards))])
    assert on_g2.filter(tflops_pod("p", 10)).failed["g2"].kind is FitKind.TFLOPS_UNKNOWN_MODEL
    # a compute share is still served by both
    share = container_request("main", {"limits": {"elasticgpu.io/gpu-core": "30"}})
    assert sorted(engine.filter(PodRequest("s", containers=(share,))).feasible) == [
        "shares-only", "with-tflops"]
