"""core.claims: binding, provisioning and reclaiming decisions (pure), on the real engine."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims import provisioning as claim_provisioning
from elastic_gpu.core.claims.binding import binding_to_finish, decide, shortfall
from elastic_gpu.core.claims.decisions import Bind, InSync, Provision
from elastic_gpu.core.claims.inventory import egpu_assignment, ledger_key
from elastic_gpu.core.claims.model import (
    CLAIM_CONTAINER,
    GPUSHARE,
    WHOLE_CARDS,
    BindingMode,
    Claim,
    ClaimPhase,
    ClaimRef,
    ElasticGPUPhase,
    GPUClass,
    LostReason,
    PendingReason,
    ReclaimPolicy,
)
from elastic_gpu.core.claims.pods import ClaimAnnotationError, pod_claims, pods_holding, pods_using
from elastic_gpu.core.claims.release import DeleteElasticGPU, Keep, MarkReleased, decide_release
from elastic_gpu.core.fit import Unschedulable
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile

CORE = "gpushare.provisioner.elasticgpu.io/gpu-core"
MEM = "gpushare.provisioner.elasticgpu.io/gpu-memory"
SEED = {CORE: 10, MEM: 4}
SHARE_CLASS = GPUClass("gpushare-egpuclass", GPUSHARE, {}, ReclaimPolicy.RETAIN,
                            BindingMode.IMMEDIATE)
WHOLE_CLASS = GPUClass("whole", WHOLE_CARDS)
MIG_CLASS = GPUClass("mig", claim_model.MIG)
WFFC_CLASS = GPUClass("late", GPUSHARE,
                           binding_mode=BindingMode.WAIT_FOR_FIRST_CONSUMER)
CLASSES = {c.name: c for c in (SHARE_CLASS, WHOLE_CLASS, MIG_CLASS, WFFC_CLASS)}


def claim(name: str = "c1", requests: Mapping[str, int | str] = SEED, cls: str | None = SHARE_CLASS.name,
          *, egpu: str | None = None, phase: ClaimPhase = ClaimPhase.PENDING,
          uid: str | None = None) -> Claim:
    return Claim("ns", name, uid or f"uid-{name}", cls, dict(requests), egpu, phase)


def cluster(nodes: int = 2, cards: int = 2, memory: int = 16384, model: str = "A100",
            mig: bool = False) -> Engine:
    def card(n: int, i: int) -> Card:
        inst = (MigInstance(MigProfile(1, 10), f"MIG-{n}-{i}", 0),) if mig else ()
        return Card(i, f"GPU-{n}-{i}", model, memory, mig=inst)
    return Engine([Node(f"n{n}", 64000, 262144, tuple(card(n, i) for i in range(cards)))
                   for n in range(nodes)], PolicyConfig())


def provision(c: Claim, engine: Engine, consumer: str | None = None) -> claim_model.ElasticGPU:
    decision = decide(c, CLASSES, {}, consumer)
    assert isinstance(decision, Provision), decision
    cls = CLASSES[c.class_name or ""]
    egpu = claim_provisioning.provision(decision, c, cls, engine)
    assert isinstance(egpu, claim_model.ElasticGPU), egpu
    engine.allocate(ledger_key(egpu.name), egpu_assignment(egpu))
    return egpu


# --------------------------------------------------------------------------- provisioning


def test_the_seed_claim_is_provisioned_as_a_share_pre_bound_to_it() -> None:
    c = claim()
    decision = decide(c, CLASSES, {})
    assert decision == Provision(GPUSHARE, PodRequest(
        "c1", "ns", "uid-c1", (ContainerRequest(CLAIM_CONTAINER, RequestKind.SHARE, 1, 100, 4,
                                                None, (CORE, MEM)),)))
    egpu = claim_provisioning.provision(decision, c, SHARE_CLASS, cluster())
    assert isinstance(egpu, claim_model.ElasticGPU)
    assert egpu.name == "egpu-uid-c1" and egpu.capacity == SEED
    assert egpu.claim_ref == ClaimRef("ns", "c1", "uid-c1")
    assert (egpu.class_name, egpu.reclaim_policy, egpu.phase) == (
        SHARE_CLASS.name, ReclaimPolicy.RETAIN, ElasticGPUPhase.BOUND)
    (share,) = egpu.shares
    assert (share.milli, share.memory_mib) == (100, 4)
    assert shortfall(c.requests, egpu.capacity) is None


def test_two_seed_claims_share_one_card_under_binpack() -> None:
    engine = cluster()
    first, second = provision(claim("c1"), engine), provision(claim("c2"), engine)
    assert first.node == second.node
    assert first.shares[0].index == second.shares[0].index
    usage = {i: (m, mem) for i, m, mem in engine.card_usage(first.node)}
    assert usage[first.shares[0].index] == (200, 8)


def test_whole_cards_and_mig_have_their_own_provisioners() -> None:
    egpu = provision(claim("w", {"nvidia.com/gpu": 2}, WHOLE_CLASS.name), cluster())
    assert len(egpu.shares) == 2 and all(s.milli == 1000 for s in egpu.shares)
    assert len({s.index for s in egpu.shares}) == 2
    egpu = provision(claim("m", {"nvidia.com/mig-1g.10gb": 1}, MIG_CLASS.name), cluster(mig=True))
    (share,) = egpu.shares
    assert share.mig_profile == "1g.10gb" and share.mig_uuid is not None


@pytest.mark.parametrize(("cls", "requests", "words"), [
    (SHARE_CLASS.name, {"nvidia.com/gpu": 2}, "asks for 2 whole card(s), but its class's provisioner "
     "gpushare.provisioner.elasticgpu.io provisions a share of one card"),
    (SHARE_CLASS.name, {CORE: 200}, "use a class whose provisioner is gpu.provisioner.elasticgpu.io"),
    (WHOLE_CLASS.name, SEED, "use a class whose provisioner is gpushare.provisioner.elasticgpu.io"),
    (MIG_CLASS.name, {"nvidia.com/gpu": 1}, "provisions MIG instances"),
    (SHARE_CLASS.name, {CORE: 150}, f"{CORE}=150: an integer 1-99 (a share of one card) or a "
     "multiple of 100"),
    (SHARE_CLASS.name, {MEM: 0}, "asks for no GPU"),
    (SHARE_CLASS.name, {CORE: 10, "tencent.com/vcuda-core": 10}, "asks for compute twice"),
])
def test_requests_a_provisioner_cannot_make_stay_pending_with_why(
        cls: str, requests: Mapping[str, int | str], words: str) -> None:
    decision = decide(claim(requests=requests, cls=cls), CLASSES, {})
    assert isinstance(decision, claim_decisions.Pending)
    assert decision.reason is PendingReason.INVALID_REQUEST
    assert words in decision.message
    assert "claim ns/c1" in decision.message


@pytest.mark.parametrize(("classes", "reason", "words"), [
    ({}, PendingReason.CLASS_NOT_FOUND, "ElasticGPUClass gpushare-egpuclass does not exist"),
    ({"gpushare-egpuclass": GPUClass("gpushare-egpuclass", "example.com/nfs")},
     PendingReason.PROVISIONER_UNKNOWN,
     "provisioner example.com/nfs is not a plug-in of this controller (known: "
     "gpu.provisioner.elasticgpu.io, gpushare.provisioner.elasticgpu.io, mig.provisioner"),
    ({"gpushare-egpuclass": GPUClass("gpushare-egpuclass", GPUSHARE, {"colour": "red"})},
     PendingReason.INVALID_PARAMETERS, "parameters.colour is not a parameter"),
    ({"gpushare-egpuclass": GPUClass("gpushare-egpuclass", GPUSHARE,
                                          {"nodePolicy": "nope"})},
     PendingReason.INVALID_PARAMETERS, "parameters.nodePolicy='nope': unknown node policy"),
    ({"gpushare-egpuclass": GPUClass("gpushare-egpuclass", GPUSHARE, {"models": " |"})},
     PendingReason.INVALID_PARAMETERS, "parameters.models=' |': an empty model list"),
])
def test_class_problems_stay_pending_with_a_reason(
        classes: Mapping[str, GPUClass], reason: PendingReason, words: str) -> None:
    decision = decide(claim(), classes, {})
    assert isinstance(decision, claim_decisions.Pending) and decision.reason is reason
    assert words in decision.message


def test_no_class_and_no_elasticgpu_is_pending() -> None:
    decision = decide(claim(cls=None), CLASSES, {})
    assert isinstance(decision, claim_decisions.Pending) and decision.reason is PendingReason.CLASS_NOT_SET


def test_class_parameters_steer_placement() -> None:
    engine = Engine([Node("t4", 64000, 262144, (Card(0, "T", "T4", 16384),)),
                     Node("a100", 64000, 262144, (Card(0, "A", "A100", 40960),))], PolicyConfig())
    cls = GPUClass("a100s", GPUSHARE, {"models": "A100"})
    c = claim(cls="a100s")
    decision = decide(c, {"a100s": cls}, {})
    assert isinstance(decision, Provision)
    assert decision.request.allowed_models == frozenset({"A100"})
    egpu = claim_provisioning.provision(decision, c, cls, engine)
    assert isinstance(egpu, claim_model.ElasticGPU) and egpu.node == "a100"


def test_wait_for_first_consumer_provisions_on_the_consumers_node() -> None:
    c = claim(cls=WFFC_CLASS.name)
    decision = decide(c, CLASSES, {})
    assert isinstance(decision, claim_decisions.Pending)
    assert decision.reason is PendingReason.WAIT_FOR_FIRST_CONSUMER
    engine = cluster(nodes=3)
    egpu = provision(c, engine, consumer="n2")
    assert egpu.node == "n2"


def test_a_claim_too_large_stays_pending_then_provisions_when_capacity_frees() -> None:
    engine = cluster(nodes=1, cards=1)
    hog = provision(claim("hog", {CORE: 90}), engine)
    big = claim("big", {CORE: 50})
    decision = decide(big, CLASSES, {})
    assert isinstance(decision, Provision)
    pending = claim_provisioning.provision(decision, big, SHARE_CLASS, engine)
    assert isinstance(pending, claim_decisions.Pending)
    assert pending.reason is PendingReason.UNSCHEDULABLE
    assert pending.message.startswith("cannot provision claim ns/big: 0/1 nodes")
    engine.release(ledger_key(hog.name))  # the hog's claim was deleted (reclaim Delete)
    assert isinstance(claim_provisioning.provision(decision, big, SHARE_CLASS, engine),
                      claim_model.ElasticGPU)


def test_a_consumer_node_without_room_is_unschedulable_there() -> None:
    engine = cluster(nodes=2, cards=1)
    provision(claim("hog", {"nvidia.com/gpu": 1}, WHOLE_CLASS.name), engine, None)
    full = next(n for n in engine.nodes() if engine.card_usage(n)[0][1] == 1000)
    c = claim(cls=WFFC_CLASS.name)
    decision = decide(c, CLASSES, {}, consumer_node=full)
    assert isinstance(decision, Provision)
    result = claim_provisioning.provision(decision, c, WFFC_CLASS, engine)
    assert isinstance(result, claim_decisions.Pending) and full in result.message


# --------------------------------------------------------------------------- binding


def egpu(name: str = "pre", capacity: Mapping[str, int | str] = SEED,
         ref: ClaimRef | None = None, cls: str | None = None,
         phase: ElasticGPUPhase = ElasticGPUPhase.AVAILABLE) -> claim_model.ElasticGPU:
    return claim_model.ElasticGPU(name, dict(capacity), "n0", (CardShare(0, "GPU-0-0", 100, 4),), ref, cls,
                           ReclaimPolicy.RETAIN, phase)


def test_static_binding_to_an_available_compatible_elasticgpu() -> None:
    c = claim(egpu="pre")
    assert decide(c, CLASSES, {"pre": egpu(capacity={CORE: 20, MEM: 8})}) == Bind("pre")
    # no class on either side binds too (a claim naming only an ElasticGPU)
    assert decide(claim(egpu="pre", cls=None), {}, {"pre": egpu()}) == Bind("pre")


@pytest.mark.parametrize(("target", "reason", "words"), [
    (None, PendingReason.ELASTICGPU_NOT_FOUND, "ElasticGPU pre does not exist"),
    (egpu(capacity={CORE: 5, MEM: 4}), PendingReason.ELASTICGPU_TOO_SMALL,
     "too small for the claim (compute milli 100 > 50)"),
    (egpu(capacity={"nvidia.com/gpu": 1}), PendingReason.ELASTICGPU_TOO_SMALL,
     "holds 1 whole card(s), the claim asks for a share of one card"),
    (egpu(cls="other"), PendingReason.CLASS_MISMATCH, "is of class other"),
    (egpu(ref=ClaimRef("ns", "someone", "u9")), PendingReason.ELASTICGPU_BOUND_ELSEWHERE,
     "bound to claim someone"),
    # the claim's namespace learns nothing of another's claims (the message is an Event there)
    (egpu(ref=ClaimRef("bob", "secret", "u9")), PendingReason.ELASTICGPU_BOUND_ELSEWHERE,
     "is bound to a claim of another namespace"),
    (egpu(phase=ElasticGPUPhase.RELEASED), PendingReason.ELASTICGPU_NOT_AVAILABLE,
     "is Released, not Available"),
])
def test_static_binding_refusals_stay_pending(target: claim_model.ElasticGPU | None,
                                              reason: PendingReason, words: str) -> None:
    decision = decide(claim(egpu="pre"), CLASSES, {"pre": target} if target else {})
    assert isinstance(decision, claim_decisions.Pending) and decision.reason is reason
    assert words in decision.message


def test_an_elasticgpu_pre_bound_by_name_binds_its_claim_only() -> None:
    pre = egpu(ref=ClaimRef("ns", "c1"))
    assert decide(claim("c1", egpu="pre"), CLASSES, {"pre": pre}) == Bind("pre")
    other = decide(claim("c2", egpu="pre"), CLASSES, {"pre": pre})
    assert isinstance(other, claim_decisions.Pending)


def test_bound_pairs_are_in_sync_and_half_bound_pairs_are_finished() -> None:
    c = claim(egpu="pre", phase=ClaimPhase.BOUND)
    bound = egpu(ref=ClaimRef.of(c), phase=ElasticGPUPhase.BOUND)
    assert decide(c, CLASSES, {"pre": bound}) == InSync("pre")
    # the claim was written but the ElasticGPU's phase not yet
    half = egpu(ref=ClaimRef.of(c))
    assert decide(c, CLASSES, {"pre": half}) == Bind("pre")


def test_a_provisioned_elasticgpu_is_bound_not_provisioned_again() -> None:
    """A controller killed between creating the ElasticGPU and updating the claim: the next
    reconcile finds egpu-<uid> pre-bound to the claim and finishes the binding."""
    engine = cluster()
    c = claim()
    made = provision(c, engine)
    assert decide(c, CLASSES, {made.name: made}) == Bind(made.name)
    # a claim re-created under the same name (new uid) does not take it
    again = claim(uid="uid-other")
    assert isinstance(decide(again, CLASSES, {made.name: made}), Provision)


def test_a_deleted_claim_finishes_a_binding_begun_for_it_and_begins_none() -> None:
    """A WaitForFirstConsumer claim provisioned at its pod's bind while the controller was
    down, then deleted: the restarted controller binds it to its ElasticGPU while the pod
    runs (the claim then says what the pod holds), and nothing new for any deleted claim."""
    engine = cluster()
    c = replace(claim(cls=WFFC_CLASS.name), deleting=True)
    made = provision(replace(c, deleting=False), engine, consumer="n0")
    assert binding_to_finish(c, {made.name: made}) == Bind(made.name)
    # a binding interrupted after the ElasticGPU's claimRef (static, or its spec written)
    named = replace(c, elastic_gpu_name="pre")
    assert binding_to_finish(named, {"pre": egpu(ref=ClaimRef.of(c))}) == Bind("pre")
    # already bound: nothing left to finish
    bound = replace(named, phase=ClaimPhase.BOUND)
    assert binding_to_finish(bound, {"pre": egpu(ref=ClaimRef.of(c),
                                                 phase=ElasticGPUPhase.BOUND)}) is None
    # not begun: no provisioning, no static binding, nothing pre-bound by name only, nothing
    # made for a former claim of the same name, nothing Released
    assert binding_to_finish(c, {}) is None
    assert binding_to_finish(named, {"pre": egpu()}) is None
    assert binding_to_finish(named, {"pre": egpu(ref=ClaimRef("ns", "c1"))}) is None
    assert binding_to_finish(replace(c, uid="uid-new"), {made.name: made}) is None
    assert binding_to_finish(named, {"pre": egpu(ref=ClaimRef.of(c),
                                                 phase=ElasticGPUPhase.RELEASED)}) is None


@pytest.mark.parametrize(("target", "reason"), [
    (None, LostReason.ELASTICGPU_MISSING),
    (egpu(ref=ClaimRef("ns", "thief", "u9"), phase=ElasticGPUPhase.BOUND),
     LostReason.ELASTICGPU_BOUND_ELSEWHERE),
])
@pytest.mark.parametrize("phase", [ClaimPhase.BOUND, ClaimPhase.LOST])
def test_a_bound_claim_whose_elasticgpu_is_gone_is_lost(target: claim_model.ElasticGPU | None,
                                                        reason: LostReason,
                                                        phase: ClaimPhase) -> None:
    """Lost is final: a claim already Lost stays Lost (not Pending waiting for a new one)."""
    c = claim(egpu="pre", phase=phase)
    decision = decide(c, CLASSES, {"pre": target} if target else {})
    assert isinstance(decision, claim_decisions.Lost) and decision.reason is reason


# --------------------------------------------------------------------------- release


def test_reclaim_policies() -> None:
    c = claim()
    for policy, expected in ((ReclaimPolicy.DELETE, DeleteElasticGPU),
                             (ReclaimPolicy.RETAIN, MarkReleased)):
        bound = claim_model.ElasticGPU("e", SEED, "n0", (), ClaimRef.of(c), None, policy,
                                ElasticGPUPhase.BOUND)
        assert decide_release(bound, c) == Keep()
        assert isinstance(decide_release(bound, None), expected)
        # a claim re-created under the same name is another claim
        assert isinstance(decide_release(bound, claim(uid="new")), expected)
    released = egpu(ref=ClaimRef.of(c), phase=ElasticGPUPhase.RELEASED)
    assert decide_release(released, None) == Keep()
    assert decide_release(egpu(), None) == Keep()
    assert decide_release(egpu(ref=ClaimRef("ns", "later")), None) == Keep()


def test_an_elasticgpu_holds_its_cards_in_the_ledger() -> None:
    engine = cluster(nodes=1, cards=1)
    whole = provision(claim("w", {"nvidia.com/gpu": 1}, WHOLE_CLASS.name), engine)
    pod = PodRequest("p", containers=(ContainerRequest.share("main", 100),))
    with pytest.raises(Unschedulable):
        engine.place(pod)
    engine.release(ledger_key(whole.name))
    assert engine.place(pod).node == "n0"


# --------------------------------------------------------------------------- properties


share_requests = st.fixed_dictionaries({}, optional={
    CORE: st.integers(1, 99), MEM: st.integers(1, 16384)}).filter(bool)


@settings(max_examples=60, deadline=None)
@given(st.lists(share_requests, min_size=1, max_size=30), st.integers(1, 3), st.integers(1, 4))
def test_provisioning_never_overfills_a_card_and_gives_what_was_asked(
        requests: list[dict[str, int]], nodes: int, cards: int) -> None:
    engine = cluster(nodes=nodes, cards=cards)
    made = []
    for i, req in enumerate(requests):
        c = claim(f"c{i}", req)
        decision = decide(c, CLASSES, {})
        assert isinstance(decision, Provision)
        result = claim_provisioning.provision(decision, c, SHARE_CLASS, engine)
        if isinstance(result, claim_decisions.Pending):
            assert result.reason is PendingReason.UNSCHEDULABLE
            continue
        engine.allocate(ledger_key(result.name), egpu_assignment(result))
        (share,) = result.shares
        assert (share.milli, share.memory_mib) == (req.get(CORE, 0) * 10, req.get(MEM, 0))
        assert shortfall(c.requests, result.capacity) is None
        made.append(result)
    for node in engine.nodes():
        for index, milli, memory in engine.card_usage(node):
            held = [s for e in made if e.node == node for s in e.shares if s.index == index]
            assert milli == sum(s.milli for s in held) <= 1000
            assert memory == sum(s.memory_mib for s in held) <= 16384


@settings(max_examples=100, deadline=None)
@given(share_requests, st.integers(0, 50), st.integers(0, 4096))
def test_shortfall_accepts_itself_and_anything_larger(req: dict[str, int], more_core: int,
                                                      more_mem: int) -> None:
    assert shortfall(req, req) is None
    bigger = {CORE: min(99, req.get(CORE, 0) + more_core) or 1,
              MEM: req.get(MEM, 0) + more_mem}
    if req.get(CORE, 0) == 0:
        bigger[CORE] = max(1, more_core)
    assert shortfall(req, bigger) is None
    if req.get(CORE, 0) > 1:
        smaller = {**req, CORE: req[CORE] - 1}
        assert shortfall(req, smaller) is not None


# --------------------------------------------------------------------------- pods


def pod(annotations: dict[str, object], *containers: str) -> dict[str, object]:
    return {"metadata": {"annotations": annotations},
            "spec": {"containers": [{"name": c} for c in containers]}}


def test_pod_claims_by_container_and_the_seeds_one_container_form() -> None:
    # the seed README: key suffix test1 on the only container test-cuda
    assert pod_claims(pod({"egpuc.elasticgpu.io/test1": "gpushare-egpuc-1"}, "test-cuda")) == {
        "test-cuda": "gpushare-egpuc-1"}
    two = pod({"egpuc.elasticgpu.io/a": "ca", "egpuc.elasticgpu.io/b": "cb", "other/x": "y"}, "a", "b")
    assert pod_claims(two) == {"a": "ca", "b": "cb"}
    assert pod_claims(pod({}, "a")) == {}
    assert pod_claims({"metadata": {}}) == {}


def with_init(p: dict[str, object], *init: tuple[str, str | None]) -> dict[str, object]:
    """`p` with init containers (name, restartPolicy; "Always": a sidecar)."""
    spec = p["spec"]
    assert isinstance(spec, dict)
    spec["initContainers"] = [{"name": n, **({"restartPolicy": r} if r else {})} for n, r in init]
    return p


def test_a_sidecar_names_a_claim_as_a_regular_container_does() -> None:
    sidecar = with_init(pod({"egpuc.elasticgpu.io/proxy": "c1", "egpuc.elasticgpu.io/a": "c2"},
                            "a", "b"), ("setup", None), ("proxy", "Always"))
    assert pod_claims(sidecar) == {"proxy": "c1", "a": "c2"}
    # the seed's form still means the only regular container, a sidecar beside it or not
    seed = with_init(pod({"egpuc.elasticgpu.io/test1": "c"}, "main"), ("proxy", "Always"))
    assert pod_claims(seed) == {"main": "c"}


def test_a_classic_init_container_naming_a_claim_is_refused_with_the_reason() -> None:
    p = with_init(pod({"egpuc.elasticgpu.io/setup": "c"}, "main"), ("setup", None))
    with pytest.raises(ClaimAnnotationError, match=re.escape(
            "annotation egpuc.elasticgpu.io/setup=c: setup is an init container that runs to "
            "completion before the pod's containers start")):
        pod_claims(p)


@pytest.mark.parametrize(("p", "words"), [
    (pod({"egpuc.elasticgpu.io/test1": "c"}, "a", "b"),
     "the pod has containers a, b and none is named 'test1'; write egpuc.elasticgpu.io/<container>"),
    (pod({"egpuc.elasticgpu.io/a": "c1", "egpuc.elasticgpu.io/x": "c2"}, "a"),
     "container a already uses claim"),
    (pod({"egpuc.elasticgpu.io/a": "Bad_Name"}, "a"), "egpuc.elasticgpu.io/a='Bad_Name': the value "
     "must name an ElasticGPUClaim"),
    (pod({"egpuc.elasticgpu.io/a": ""}, "a"), "must name an ElasticGPUClaim"),
])
def test_unreadable_claim_annotations_say_why(p: dict[str, object], words: str) -> None:
    with pytest.raises(ClaimAnnotationError, match=re.escape(words)):
        pod_claims(p)


def test_pods_using_a_claim_hold_its_finalizer_until_they_finish() -> None:
    c = claim("c1")
    def p(name: str, ns: str = "ns", phase: str = "Running", key: str = "egpuc.elasticgpu.io/main",
          value: str = "c1", containers: tuple[str, ...] = ("main",)) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": ns, "annotations": {key: value}},
                "spec": {"containers": [{"name": n} for n in containers]},
                "status": {"phase": phase}}
    pods = [p("a"), p("b", phase="Pending"), p("done", phase="Succeeded"), p("dead", phase="Failed"),
            p("elsewhere", ns="other"), p("another", value="c2"),
            # unreadable (suffix names no container of two): counted, to be safe
            p("odd", key="egpuc.elasticgpu.io/x", containers=("m", "n"))]
    assert pods_using(c, pods) == ["ns/a", "ns/b", "ns/odd"]
    assert pods_using(c, []) == []


def test_an_elasticgpu_whose_claim_is_gone_is_kept_while_a_pod_uses_its_cards() -> None:
    """Issue #26, item 2: a claim deleted without its finalizer (or with it removed) must not
    take the card from under its pod: release waits for every pod that uses the cards, named
    by the assignment's `claims` or by the claim annotation, until it has stopped."""
    from elastic_gpu.core import annotations as ann
    from elastic_gpu.core.assignment import Assignment

    c = claim("c1")
    share = CardShare(0, "GPU-0", 1000, 0)
    for policy in ReclaimPolicy:
        bound = claim_model.ElasticGPU("egpu-1", SEED, "n0", (share,), ClaimRef.of(c), None,
                                policy, ElasticGPUPhase.BOUND)

        def p(name: str, notes: dict[str, str], ns: str = "ns", phase: str = "Running",
              deleting: bool = False, states: str = "running") -> dict[str, object]:
            meta: dict[str, object] = {"name": name, "namespace": ns, "annotations": notes}
            if deleting:
                meta["deletionTimestamp"] = "2026-11-28T15:00:00Z"
            return {"metadata": meta, "spec": {"containers": [{"name": "main"}]},
                    "status": {"phase": phase, "containerStatuses": [
                        {"name": "main", "state": {states: {}}}]}}

        marked = Assignment("n0", {"main": (share,)}, {"main": "egpu-1"}).to_json()
        by_assignment = p("a", {ann.ASSIGNMENT: marked})
        by_annotation = p("b", {"egpuc.elasticgpu.io/main": "c1"}, phase="Pending")
        unreadable = p("odd", {ann.ASSIGNMENT: '{"v": 1, "claims": "egpu-1"'})
        gone = [p("done", {ann.ASSIGNMENT: marked}, phase="Succeeded"),
                p("stopped", {"egpuc.elasticgpu.io/main": "c1"}, deleting=True,
                  states="terminated"),
                p("elsewhere", {"egpuc.elasticgpu.io/main": "c1"}, ns="other"),
                p("other", {"egpuc.elasticgpu.io/main": "c2"})]
        holders = pods_holding(bound, [by_assignment, by_annotation, unreadable, *gone])
        assert holders == ["ns/a", "ns/b", "ns/odd"]
        assert decide_release(bound, None, holders) == Keep(("ns/a", "ns/b", "ns/odd"))
        # still deleting but running: still held
        assert pods_holding(bound, [p("a", {ann.ASSIGNMENT: marked}, deleting=True)]) \
            == ["ns/a"]
        # every pod stopped or gone: the policy applies
        expected = DeleteElasticGPU if policy is ReclaimPolicy.DELETE \
            else MarkReleased
        assert isinstance(decide_release(bound, None, pods_holding(bound, gone)),
                          expected)


def test_settled_claims_are_bound_or_lost_to_a_named_elasticgpu_and_not_deleting() -> None:
    from elastic_gpu.core.claims.binding import settled
    from elastic_gpu.core.claims.model import Claim, ClaimPhase

    base = Claim("ns", "c", "uid-1", "gpushare", {"elasticgpu.io/gpu-core": 10})
    assert not settled(base)  # just created
    bound = Claim("ns", "c", "uid-1", "gpushare", {}, "egpu-uid-1", ClaimPhase.BOUND)
    assert settled(bound)
    assert settled(Claim("ns", "c", "u", None, {}, "egpu-x", ClaimPhase.LOST))
    assert not settled(Claim("ns", "c", "u", None, {}, "egpu-x", ClaimPhase.BOUND, deleting=True))
    assert not settled(Claim("ns", "c", "u", None, {}, "egpu-x", ClaimPhase.PENDING))
    assert not settled(Claim("ns", "c", "u", "gpushare", {}, None, ClaimPhase.BOUND))


def test_a_keep_without_holders_is_a_keep_whoever_holds_the_cards() -> None:
    """The reclaimer reads the pods (a parse of each GPU pod's assignment) only when
    `decide_release` without them does not keep the ElasticGPU: a Keep that needs no holders
    must be the same Keep with any."""
    c = claim()
    holders = ("ns/pod-a", "ns/pod-b")
    cases = [
        (claim_model.ElasticGPU("e", SEED, "n0", (), ClaimRef.of(c), None, ReclaimPolicy.DELETE,
                                ElasticGPUPhase.BOUND), c),
        (egpu(ref=ClaimRef.of(c), phase=ElasticGPUPhase.RELEASED), None),
        (egpu(), None),
        (egpu(ref=ClaimRef("ns", "later")), None),
    ]
    for elastic_gpu, its_claim in cases:
        assert decide_release(elastic_gpu, its_claim) == Keep()
        assert decide_release(elastic_gpu, its_claim, holders) == Keep()
    gone = claim_model.ElasticGPU("e", SEED, "n0", (), ClaimRef.of(c), None, ReclaimPolicy.DELETE,
                                  ElasticGPUPhase.BOUND)
    assert isinstance(decide_release(gone, None), DeleteElasticGPU)  # the pods are read then
    assert decide_release(gone, None, holders) == Keep(holders)
