"""Cards pinned by UUID (`PodRequest.allowed_cards` / `denied_cards`, HAMi's use-gpuuuid and
nouse-gpuuuid): honoured at filter, in the explanation, and at bind, so a pinned pod never
lands on another card."""

from __future__ import annotations

from engine_helpers import gpu_node, share, whole

from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.placement import Engine


def test_a_pinned_share_lands_only_on_its_card_and_fills_it_before_failing() -> None:
    engine = Engine([gpu_node("n1", cards=4), gpu_node("n2", cards=4)])
    for i in range(3):
        pod = share(f"p{i}", 300, allowed_cards=frozenset({"GPU-n2-2", "GPU-x"}))
        assert engine.filter(pod).feasible == ["n2"]
        assignment = engine.place(pod)
        assert (assignment.node, {s.uuid for s in assignment.shares()}) == ("n2", {"GPU-n2-2"})
        engine.allocate(pod.key, assignment, pod)
    full = engine.filter(share("p3", 300, allowed_cards=frozenset({"GPU-n2-2"})))
    assert full.feasible == []
    assert full.failed["n1"].kind is FitKind.CARD_NOT_PINNED
    assert describe(full.failed["n1"]) == ("none of the node's 4 cards is one the pod names by "
                                           "UUID (elasticgpu.io/gpu-uuid, gpu-uuid-deny)")
    assert full.failed["n2"].kind is FitKind.INSUFFICIENT_SHARE


def test_denied_cards_are_never_chosen_for_whole_cards_and_bind_honours_them() -> None:
    engine = Engine([gpu_node("n1", cards=2)])
    pod = whole("w", 1, denied_cards=frozenset({"GPU-n1-0"}))
    assignment = engine.assign(pod, "n1", "binpack")
    assert {s.uuid for s in assignment.shares()} == {"GPU-n1-1"}
    assert engine.filter(whole("w2", 2, denied_cards=frozenset({"GPU-n1-0"}))).feasible == []
