"""Which pending pods a freeing of GPU capacity wakes (core.wakeup.plan_wakeups)."""

from __future__ import annotations

from egpu_testing.workbench import pod_manifest
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.core.wakeup import SAMPLE_MIN_NODES, Waiter, asked_nodes, candidates, plan_wakeups


def engine(*nodes: tuple[str, int]) -> Engine:
    return Engine([Node(name, 64_000, 256_000,
                        tuple(Card(i, f"GPU-{name}-{i}", "T4", 16384) for i in range(cards)))
                   for name, cards in nodes],
                  config=PolicyConfig(check_host_resources=False))


def waiter(name: str, percent: int, nodes: tuple[str, ...] = ("n1", "n2"), since: int = 0,
           priority: int = 0, model: str | None = None) -> Waiter:
    notes = {"elasticgpu.io/gpu-model": model} if model else None
    pod = pod_manifest(name, uid=f"uid-{name}", annotations=notes,
                       limits={"elasticgpu.io/gpu-core": str(percent)})
    return Waiter(f"uid-{name}", pod_request_from_manifest(pod), frozenset(nodes), since,
                  priority)


def whole(node: str, index: int) -> Assignment:
    return Assignment(node, {"main": (CardShare(index, f"GPU-{node}-{index}", 1000, 16384),)})


def test_only_pods_that_fit_where_capacity_freed_after_they_were_turned_away() -> None:
    eng = engine(("n1", 1), ("n2", 1))
    eng.allocate("holder-n2", whole("n2", 0))
    waiters = [waiter("fits", 100, since=1),
               waiter("other-node-only", 100, nodes=("n2",), since=1),
               waiter("turned-away-after", 100, since=5),
               waiter("wrong-model", 100, since=1, model="A100")]
    plan = plan_wakeups(eng, waiters, {"n1": 3})
    assert [w.uid for w in plan.wake] == ["uid-fits"]
    assert plan.wake[0].node == "n1" and plan.wake[0].name == "fits"
    # checked: every waiter with a freed node in view, woken or not
    assert set(plan.checked) == {"uid-fits", "uid-wrong-model"}
    assert eng.allocations().keys() == {"holder-n2"}  # the round's claims are gone


def test_one_freed_card_wakes_one_whole_card_pod_but_every_share_it_holds() -> None:
    eng = engine(("n1", 1))
    whole_pods = [waiter(f"whole-{i}", 100, nodes=("n1",)) for i in range(5)]
    plan = plan_wakeups(eng, whole_pods, {"n1": 1})
    assert len(plan.wake) == 1
    shares = [waiter(f"share-{i}", 30, nodes=("n1",)) for i in range(5)]
    plan = plan_wakeups(eng, shares, {"n1": 1})
    assert len(plan.wake) == 3  # 3 x 30% fit one card, the claims of the first ones count


def test_higher_priority_then_longest_waiting_first_and_the_round_is_bounded() -> None:
    eng = engine(("n1", 4))
    waiters = [waiter("late", 100, nodes=("n1",), since=2),
               waiter("early", 100, nodes=("n1",), since=1),
               waiter("important", 100, nodes=("n1",), since=3, priority=10)]
    plan = plan_wakeups(eng, waiters, {"n1": 9})
    assert [w.name for w in plan.wake] == ["important", "early", "late"]
    many = [waiter(f"p{i:03d}", 10, nodes=("n1",), since=i) for i in range(100)]
    plan = plan_wakeups(eng, many, {"n1": 500}, check_limit=64, wake_limit=20)
    assert len(plan.wake) == 20 and plan.deferred == 80
    assert [w.name for w in plan.wake] == [f"p{i:03d}" for i in range(20)]


def test_candidates_are_the_waiters_nodes_freed_after_it() -> None:
    w = waiter("a", 10, nodes=("n1", "n2", "n3"), since=4)
    assert candidates(w, {"n1": 5, "n2": 4, "n3": 9, "n9": 10}) == ["n1", "n3"]
    big = {f"x{i}": 10 for i in range(10)} | {"n2": 7}
    assert candidates(w, big) == ["n2"]


def test_a_sample_of_the_nodes_stands_for_any_node() -> None:
    """kube-scheduler sends extenders at most max(100, a percentage) of the nodes that pass
    its filters: a pod turned away by a sample may fit on any node that frees."""
    few = [f"n{i}" for i in range(SAMPLE_MIN_NODES - 1)]
    assert asked_nodes(few, 5000) == frozenset(few)  # fewer than 100: every feasible node
    sample = [f"n{i}" for i in range(500)]
    assert asked_nodes(sample, 5000) is None
    assert asked_nodes(sample, 500) == frozenset(sample)  # the whole cluster
    w = Waiter("uid-a", waiter("a", 10).request, None, since=2)
    assert candidates(w, {"far": 3, "old": 2}) == ["far"]


def test_a_pod_whose_own_defrag_reservation_lies_on_a_freed_node_is_woken() -> None:
    # the defragmentation controller reserved n1's card for `pending` and evicted its holder;
    # kube-scheduler retried `pending` before the extender saw the eviction, so it was turned
    # away; the engine holds the reservation under the pod's own key, so a fit check sees n1
    # full: without `reserved` it was never woken (kube-scheduler's 5-minute flush retried it)
    eng = engine(("n1", 1))
    eng.allocate("uid-pending", whole("n1", 0))
    pending = waiter("pending", 100, nodes=("n1", "n2"))
    assert plan_wakeups(eng, [pending], {"n1": 1}).wake == ()
    plan = plan_wakeups(eng, [pending], {"n1": 1}, reserved={"uid-pending": "n1"})
    assert [(w.uid, w.node) for w in plan.wake] == [("uid-pending", "n1")]
    # a reservation on a node that did not free since wakes nothing, nor one for another pod
    assert plan_wakeups(eng, [pending], {"n2": 1}, reserved={"uid-pending": "n1"}).wake == ()
    other = waiter("other", 100, nodes=("n1",))
    assert plan_wakeups(eng, [other], {"n1": 1}, reserved={"uid-pending": "n1"}).wake == ()
    assert eng.allocations().keys() == {"uid-pending"}
