"""The extender and the Elastic GPU API (issue #15): ElasticGPUs in the ledger, pods that name
claims, `POST /provision`, WaitForFirstConsumer provisioning at bind."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from egpu_testing.claims import claim_object, claim_pod, class_object, elasticgpu_object
from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, AssignmentError, CardShare
from elastic_gpu.core.claims.inventory import egpu_assignment
from elastic_gpu.core.claims.model import WHOLE_CARDS, ClaimRef
from elastic_gpu.core.claims.pods import pod_claims
from elastic_gpu.core.fit import describe
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.app import Feeds
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.handle import BindError
from elastic_gpu.scheduler.state import SchedulerState
from elastic_gpu.scheduler.state.handle import EGPU_KEY

CORE = "elasticgpu.io/gpu-core"


def gpu_node(name: str, cards: int = 1) -> Node:
    return Node(name, 64_000, 256_000, tuple(Card(i, f"GPU-{name}-{i}", "T4", 16384)
                                             for i in range(cards)))


def share(node: str, index: int, milli: int) -> CardShare:
    return CardShare(index, f"GPU-{node}-{index}", milli, 0)


def used(state: SchedulerState, node: str) -> int:
    return sum(milli for _, milli, _ in state.card_usage()[node])


def fits(state: SchedulerState, percent: int, nodes: list[str]) -> list[str]:
    pod = pod_manifest(f"probe-{percent}", uid=f"uid-probe-{percent}", limits={CORE: str(percent)})
    return state.filter(pod_request_from_manifest(pod), f"uid-probe-{percent}", nodes).feasible


def feed(state: SchedulerState, *, egpus: list[dict[str, Any]] = (),  # type: ignore[assignment]
         claims: list[dict[str, Any]] = (), classes: list[dict[str, Any]] = ()  # type: ignore[assignment]
         ) -> Feeds:
    feeds = Feeds(state)
    feeds.egpus_replace(list(egpus))
    feeds.claims_replace(list(claims))
    feeds.classes_replace(list(classes))
    return feeds


# ---- the assignment's claims mark ---------------------------------------------------------------


def test_the_claims_mark_round_trips_and_older_annotations_still_parse() -> None:
    marked = Assignment("n1", {"main": (share("n1", 0, 300),), "side": (share("n1", 0, 200),)},
                        {"main": "egpu-1"})
    text = marked.to_json()
    assert json.loads(text)["claims"] == {"main": "egpu-1"} and json.loads(text)["v"] == 1
    assert Assignment.from_json(text) == marked
    assert marked.unclaimed() == Assignment("n1", {"side": (share("n1", 0, 200),)})
    old = Assignment("n1", {"main": (share("n1", 0, 300),)})
    assert "claims" not in old.to_json()
    assert Assignment.from_json(old.to_json()) == old and old.unclaimed() == old
    only_claims = Assignment("n1", {"main": (share("n1", 0, 300),)}, {"main": "egpu-1"})
    assert only_claims.unclaimed() is None


@pytest.mark.parametrize(("claims", "words"), [
    ([], "claims must be an object"),
    ({"ghost": "egpu-1"}, "names container 'ghost'"),
    ({"main": 3}, "claims['main']=3 is not an ElasticGPU name"),
    ({"main": ""}, "is not an ElasticGPU name"),
])
def test_the_claims_mark_is_parsed_strictly(claims: Any, words: str) -> None:
    body = json.loads(Assignment("n1", {"main": (share("n1", 0, 300),)}).to_json())
    body["claims"] = claims
    with pytest.raises(AssignmentError, match=words.replace("[", r"\[").replace("]", r"\]")):
        Assignment.from_json(json.dumps(body))


# ---- the ledger -----------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [None, "Available", "Bound", "Released", "Failed"])
def test_an_elasticgpus_cards_are_never_given_to_a_pod(phase: str | None) -> None:
    state = ready_state([gpu_node("n1"), gpu_node("n2")])
    feed(state, egpus=[elasticgpu_object("e1", "n1", [share("n1", 0, 600)], phase=phase)])
    assert used(state, "n1") == 600
    assert fits(state, 50, ["n1", "n2"]) == ["n2"]
    assert fits(state, 40, ["n1"]) == ["n1"]
    assert state.egpu_holds() == {"e1": egpu_assignment(
        api.elasticgpu_from_object(elasticgpu_object("e1", "n1", [share("n1", 0, 600)])))}
    # a pod can also not be bound onto them, whatever kube-scheduler asks
    pod = pod_manifest("p", uid="uid-p", limits={CORE: "50"})
    with pytest.raises(Exception, match="compute"):
        state.reserve(pod_request_from_manifest(pod), "uid-p", "n1")
    # deleted: the cards are free
    Feeds(state).egpus_event("DELETED", elasticgpu_object("e1", "n1", [share("n1", 0, 600)]))
    assert used(state, "n1") == 0 and fits(state, 50, ["n1"]) == ["n1"]


def test_an_elasticgpu_and_a_pod_annotated_on_the_same_cards_are_both_counted() -> None:
    """A pod holding a card it has no claim on is refused like any over-commit: the
    ElasticGPU's hold is counted first on a rebuild, and the conflicting pod is the one
    reported."""
    state = ready_state([gpu_node("n1")])
    feed(state, egpus=[elasticgpu_object("e1", "n1", [share("n1", 0, 1000)])])
    squatter = pod_manifest("sq", uid="uid-sq", limits={CORE: "50"})
    squatter["metadata"]["annotations"] = {ann.ASSIGNMENT: Assignment(
        "n1", {"main": (share("n1", 0, 500),)}).to_json(), ann.ASSIGNED_NODE: "n1"}
    squatter["spec"]["nodeName"] = "n1"
    state.observe_pod(squatter)
    assert used(state, "n1") == 1000 and "uid-sq" in state.conflicts()
    # the ElasticGPU goes: the pod is counted at once, not at the next inventory change
    Feeds(state).egpus_event("DELETED", elasticgpu_object("e1", "n1", [share("n1", 0, 1000)]))
    assert used(state, "n1") == 500 and not state.conflicts()
    assert state.holds()["uid-sq"].node == "n1"


def consuming_pod(name: str, egpu: str, shares: tuple[CardShare, ...],
                  side: tuple[CardShare, ...] = ()) -> dict[str, Any]:
    resources = {"main": {CORE: "60"}}
    containers: dict[str, tuple[CardShare, ...]] = {"main": shares}
    if side:
        resources["side"] = {CORE: "20"}
        containers["side"] = side
    pod = claim_pod(name, {"main": "c1"}, resources=resources)
    assignment = Assignment("n1", containers, {"main": egpu})
    return with_binding(pod, "n1", assignment)


def test_a_consuming_pod_does_not_count_its_claims_cards_again() -> None:
    state = ready_state([gpu_node("n1")])
    egpu = elasticgpu_object("e1", "n1", [share("n1", 0, 600)], claim=("default", "c1", "u1"))
    feed(state, egpus=[egpu])
    state.observe_pod(consuming_pod("a", "e1", (share("n1", 0, 600),)))
    assert used(state, "n1") == 600  # not 1200: the ElasticGPU holds them, once
    assert "uid-a" not in state.holds() and not state.conflicts()
    # its other containers are its own
    state.observe_pod(consuming_pod("b", "e1", (share("n1", 0, 600),),
                                    side=(share("n1", 0, 200),)))
    assert used(state, "n1") == 800
    assert state.holds()["uid-b"] == Assignment("n1", {"side": (share("n1", 0, 200),)})
    state.forget_pod("uid-b")
    state.forget_pod("uid-a")
    assert used(state, "n1") == 600  # the pods are gone, the ElasticGPU still holds its cards


def egpu_holds_agree(state: SchedulerState) -> bool:
    """`egpu_holds` (kept beside the holds) is the ElasticGPU keys of every hold."""
    return state.egpu_holds() == {key[len(EGPU_KEY):]: held for key, held
                                  in state.holds().items() if key.startswith(EGPU_KEY)}


def test_a_relist_rebuilds_the_same_holds() -> None:
    nodes = [gpu_node(f"n{i}", cards=2) for i in range(1, 4)]
    egpus = [elasticgpu_object("e1", "n1", [share("n1", 0, 600)], claim=("default", "c1", "u1")),
             elasticgpu_object("e2", "n2", [share("n2", 1, 1000)], phase="Released"),
             elasticgpu_object("e3", "n3", [share("n3", 0, 300), share("n3", 1, 300)])]
    pods = [consuming_pod("a", "e1", (share("n1", 0, 600),), side=(share("n1", 1, 200),))]
    first = ready_state(nodes)
    feed(first, egpus=egpus)
    for pod in pods:
        first.observe_pod(pod)
    # a restarted extender: lists in another order (pods before ElasticGPUs)
    second = ready_state(nodes, pods=pods)
    feed(second, egpus=list(reversed(egpus)))
    assert second.card_usage() == first.card_usage()
    assert second.holds() == first.holds() and second.egpu_holds() == first.egpu_holds()
    assert not second.conflicts()
    # a relist that no longer has e2 frees its card; one with a new ElasticGPU adds it
    feed(second, egpus=[egpus[0], egpus[2],
                        elasticgpu_object("e4", "n2", [share("n2", 0, 100)])])
    assert sorted(second.egpu_holds()) == ["e1", "e3", "e4"]
    assert egpu_holds_agree(first) and egpu_holds_agree(second)
    assert dict((i, m) for i, m, _ in second.card_usage()["n2"]) == {0: 100, 1: 0}


def test_a_node_rebuild_recounts_elasticgpus() -> None:
    """Inventory relists rebuild the engine (many nodes dirty): ElasticGPUs are counted again."""
    nodes = [gpu_node(f"n{i}") for i in range(80)]
    state = ready_state(nodes)
    feed(state, egpus=[elasticgpu_object("e1", "n7", [share("n7", 0, 900)])])
    state.replace_nodes([])
    state.replace_devices([])
    assert state.node_names() == []
    ready_state(nodes, state)
    assert used(state, "n7") == 900 and fits(state, 20, ["n7"]) == []


# ---- pods that name claims -----------------------------------------------------------------------


def claim_state(mode: str = "Immediate") -> tuple[SchedulerState, Feeds]:
    state = ready_state([gpu_node("n1"), gpu_node("n2"), gpu_node("n3")])
    feeds = feed(state, classes=[class_object("share", mode=mode)],
                 claims=[claim_object("c1", {CORE: 40}, uid="u1")])
    return state, feeds


def filter_claim_pod(state: SchedulerState, pod: dict[str, Any], nodes: list[str]
                     ) -> tuple[list[str], dict[str, str]]:
    result, reasons = state.filter_claims(pod_request_from_manifest(pod), pod["metadata"]["uid"],
                                          nodes, pod_claims(pod))
    return result.feasible, {node: describe(failure) for node, failure in reasons.items()}


def test_a_pod_naming_a_bound_claim_fits_only_its_elasticgpus_node() -> None:
    state, feeds = claim_state()
    feeds.egpus_event("ADDED", elasticgpu_object("egpu-u1", "n2", [share("n2", 0, 400)],
                                                 claim=("default", "c1", "u1")))
    pod = claim_pod("p", {"main": "c1"}, resources={"main": {CORE: "40"}})
    feasible, reasons = filter_claim_pod(state, pod, ["n1", "n2", "n3"])
    assert feasible == ["n2"]
    assert reasons == dict.fromkeys(["n1", "n3"], "ElasticGPUClaim default/c1 is bound to "
                                    "ElasticGPU egpu-u1 on node n2")
    # its claim container needs nothing more, even where the card is full
    feeds.egpus_event("ADDED", elasticgpu_object("other", "n2", [share("n2", 0, 600)]))
    assert used(state, "n2") == 1000
    assert filter_claim_pod(state, pod, ["n1", "n2", "n3"])[0] == ["n2"]
    # but its other containers are placed normally
    two = claim_pod("q", {"main": "c1"}, resources={"main": {CORE: "40"}, "side": {CORE: "10"}})
    assert filter_claim_pod(state, two, ["n1", "n2", "n3"])[0] == []


def sidecar_claim_pod(name: str) -> dict[str, Any]:
    """A pod whose sidecar (restartPolicy Always) names claim c1, as the webhook leaves it: the
    claim's share in the sidecar; its regular container asks 10% of its own."""
    pod = claim_pod(name, {"proxy": "c1"}, resources={"main": {CORE: "10"}})
    limits = {CORE: "40"}
    pod["spec"]["initContainers"] = [{"name": "proxy", "image": "busybox",
                                      "restartPolicy": "Always",
                                      "resources": {"limits": limits, "requests": limits}}]
    return pod


def test_a_sidecar_naming_a_bound_claim_is_served_its_elasticgpus_cards() -> None:
    """The claim's binding reads sidecars as it reads regular containers: the sidecar gets the
    ElasticGPU's cards (marked with its name), the regular container a card of its own, and
    the agent's Allocate matching serves each its own."""
    from elastic_gpu.agent.matching import candidates

    state, feeds = claim_state()
    claimed = share("n2", 0, 400)
    feeds.egpus_event("ADDED", elasticgpu_object("egpu-u1", "n2", [claimed],
                                                 claim=("default", "c1", "u1")))
    pod = sidecar_claim_pod("p")
    assert pod_claims(pod) == {"proxy": "c1"}
    feasible, reasons = filter_claim_pod(state, pod, ["n1", "n2", "n3"])
    assert feasible == ["n2"] and set(reasons) == {"n1", "n3"}
    request = pod_request_from_manifest(pod)
    _, assignment, created = state.reserve_claims(request, "uid-p", "n2",
                                                  state.claim_view("default", pod_claims(pod)))
    assert created == [] and assignment.claims == {"proxy": "egpu-u1"}
    assert assignment.containers["proxy"] == (claimed,)
    own = assignment.containers["main"]
    assert [s.milli for s in own] == [100]

    bound = with_binding(pod, "n2", assignment)
    found, problems = candidates([bound], "n2", CORE, 40, ())
    assert problems == [] and [(c.container, c.shares, c.claim) for c in found] == [
        ("proxy", (claimed,), "egpu-u1")]
    found, _ = candidates([bound], "n2", CORE, 10, ())
    assert [(c.container, c.shares, c.claim) for c in found] == [("main", own, None)]


def test_a_pod_naming_an_unbound_immediate_claim_fits_nowhere_and_is_woken_when_bound() -> None:
    state, feeds = claim_state()
    pod = claim_pod("p", {"main": "c1"}, resources={"main": {CORE: "40"}})
    state.observe_pod(pod)
    feasible, reasons = filter_claim_pod(state, pod, ["n1", "n2"])
    assert feasible == []
    assert set(reasons) == {"n1", "n2"}
    assert reasons["n1"].startswith("ElasticGPUClaim default/c1 is Pending: not bound yet")
    assert state.wakeups() == []
    feeds.egpus_event("ADDED", elasticgpu_object("egpu-u1", "n3", [share("n3", 0, 400)],
                                                 claim=("default", "c1", "u1")))
    assert state.wakeup_pending()
    wakes = state.wakeups()
    assert [(w.uid, w.node) for w in wakes] == [("uid-p", "n3")]
    assert wakes[0].reason == "the ElasticGPUClaims this pod names can now be placed on node n3"
    assert state.wakeups() == []  # once
    # a wake-up that may not have landed is sent again
    state.wakeup_done(wakes[0], sent=False, definite=False)
    assert state.wakeups() == wakes


def test_one_wait_for_first_consumer_claim_named_by_two_containers_is_refused() -> None:
    state, _ = claim_state("WaitForFirstConsumer")
    pod = claim_pod("p", {"a": "c1", "b": "c1"}, resources={"a": {CORE: "40"}, "b": {CORE: "40"}})
    assert filter_claim_pod(state, pod, ["n1"])[1] == {"n1": (
        "ElasticGPUClaim default/c1 (WaitForFirstConsumer) is named by containers a, b; until "
        "it is bound, one container of a pod may name it")}


def test_a_missing_claim_and_a_missing_class_are_named() -> None:
    state, feeds = claim_state()
    pod = claim_pod("p", {"main": "nope"}, resources={"main": {CORE: "40"}})
    assert filter_claim_pod(state, pod, ["n1"])[1] == {
        "n1": "ElasticGPUClaim default/nope does not exist"}
    feeds.claims_event("ADDED", claim_object("c2", {CORE: 40}, uid="u2", class_name="gone"))
    pod = claim_pod("q", {"main": "c2"}, resources={"main": {CORE: "40"}})
    assert filter_claim_pod(state, pod, ["n1"])[1] == {
        "n1": "ElasticGPUClaim default/c2 is Pending: ElasticGPUClass gone does not exist"}


def test_a_wait_for_first_consumer_claim_is_placed_on_its_request() -> None:
    state, feeds = claim_state("WaitForFirstConsumer")
    feeds.egpus_event("ADDED", elasticgpu_object("x", "n1", [share("n1", 0, 900)]))
    pod = claim_pod("p", {"main": "c1"}, resources={"main": {CORE: "40"}})
    feasible, reasons = filter_claim_pod(state, pod, ["n1", "n2"])
    assert feasible == ["n2"] and reasons == {}


def test_a_sidecar_first_consumer_provisions_the_claim_with_the_cards_chosen_for_it() -> None:
    state, _ = claim_state("WaitForFirstConsumer")
    pod = sidecar_claim_pod("p")
    view = state.claim_view("default", pod_claims(pod))
    assert set(view.first_consumer) == {"proxy"}
    _, assignment, created = state.reserve_claims(pod_request_from_manifest(pod), "uid-p", "n1",
                                                  view)
    [(egpu, _)] = created
    assert [s.milli for s in egpu.shares] == [400]  # the sidecar's 40%, not main's 10%
    assert assignment.claims == {"proxy": egpu.name}
    assert assignment.containers["proxy"] == egpu.shares


def test_preemption_never_frees_an_elasticgpus_cards_and_a_consumer_frees_only_its_own() -> None:
    state = ready_state([gpu_node("n1")])
    feed(state, egpus=[elasticgpu_object("e1", "n1", [share("n1", 0, 600)],
                                         claim=("default", "c1", "u1"))])
    victim = consuming_pod("a", "e1", (share("n1", 0, 600),), side=(share("n1", 0, 200),))
    state.observe_pod(victim)
    assert used(state, "n1") == 800
    high = pod_manifest("hi", uid="uid-hi", limits={CORE: "30"}, priority=100)
    state.observe_pod(high)
    req = pod_request_from_manifest(high)
    # 20% is free; evicting the consumer frees its side container's 20%: 40% >= 30%
    assert state.preempt(req, "uid-hi", {"n1": (["uid-a"], 0)}) == {"n1": (["uid-a"], 0)}
    big = pod_manifest("big", uid="uid-big", limits={CORE: "50"}, priority=100)
    state.observe_pod(big)
    # 50% would need the ElasticGPU's cards: no victim set makes it fit
    assert state.preempt(pod_request_from_manifest(big), "uid-big",
                         {"n1": (["uid-a"], 0)}) == {}
    assert used(state, "n1") == 800  # the what-if restored everything


# ---- POST /provision and binds over HTTP ------------------------------------------------------


class FakeClaimApi:
    """The API worker's Elastic GPU calls: objects by name; `gate` holds creations."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.egpus: dict[str, dict[str, Any]] = {}
        self.creates = 0
        self.gate: asyncio.Event | None = None
        self.bound: dict[str, dict[str, str]] = {}

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        self.bound[name] = {"node": node, **annotations}

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))

    async def get_elasticgpu(self, name: str) -> dict[str, Any] | None:
        return self.egpus.get(name)

    async def create_elasticgpu(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.creates += 1
        if self.gate is not None:
            await self.gate.wait()
        name = obj["metadata"]["name"]
        if name in self.egpus:
            raise BindError(f'elasticgpus "{name}" already exists', definite=True, code=409)
        stored = json.loads(json.dumps(obj))
        stored["metadata"]["uid"] = f"obj-{name}"
        stored["status"] = {}
        self.egpus[name] = stored
        return stored


async def post(client: TestClient[Any, Any], verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body)
    response = await client.post(f"/{verb}", data=data)
    return response.status, await response.json()


async def test_provision_creates_the_elasticgpu_and_its_cards_are_held() -> None:
    state, _ = claim_state()
    api_ = FakeClaimApi()
    async with TestClient(TestServer(Extender(state, api_, claims_api=api_).app())) as client:
        status, answer = await post(client, "provision",
                                    {"namespace": "default", "name": "c1", "uid": "u1"})
        assert status == 200 and answer["result"] == "Provisioned", answer
        assert answer["elasticGPU"] == "egpu-u1"
        created = api_.egpus["egpu-u1"]
        assert created["spec"]["claimRef"] == {"namespace": "default", "name": "c1", "uid": "u1"}
        assert created["spec"]["capacity"] == {CORE: 40}
        assert created["spec"]["node"] == answer["node"]
        assert created["spec"]["egpuClassName"] == "share"
        assert [c["milli"] for c in created["spec"]["cards"]] == [400]
        node = answer["node"]
        assert used(state, node) == 400 and state.egpu_holds()["egpu-u1"].node == node
        # idempotent: the same answer, nothing created again
        status, again = await post(client, "provision",
                                   {"namespace": "default", "name": "c1", "uid": "u1"})
        assert (status, again) == (200, answer) and api_.creates == 1
        assert used(state, node) == 400


async def test_provision_answers_pending_notneeded_404_400_and_503() -> None:
    state, feeds = claim_state()
    feeds.claims_event("ADDED", claim_object("huge", {"nvidia.com/gpu": 2}, uid="u9",
                                             class_name="whole"))
    feeds.classes_event("ADDED", class_object("whole", provisioner=WHOLE_CARDS))
    api_ = FakeClaimApi()
    async with TestClient(TestServer(Extender(state, api_, claims_api=api_).app())) as client:
        status, answer = await post(client, "provision",
                                    {"namespace": "default", "name": "huge", "uid": "u9"})
        assert status == 200 and answer["result"] == "Pending"
        assert answer["reason"] == "Unschedulable"
        assert answer["message"].startswith("cannot provision claim default/huge: 0/3 nodes")
        assert api_.creates == 0 and used(state, "n1") == 0
        # a uid the cache does not know is checked in the API
        api_.claims[("default", "c1")] = claim_object("c1", {CORE: 40}, uid="u1")
        status, answer = await post(client, "provision",
                                    {"namespace": "default", "name": "c1", "uid": "other"})
        assert status == 404 and "has uid u1, not other" in answer["Error"]
        status, answer = await post(client, "provision",
                                    {"namespace": "default", "name": "zz", "uid": "u"})
        assert status == 404 and "does not exist" in answer["Error"]
        # a claim the cache has not seen yet is read through the API
        api_.claims[("default", "late")] = claim_object("late", {CORE: 10}, uid="u5")
        status, answer = await post(client, "provision",
                                    {"namespace": "default", "name": "late", "uid": "u5"})
        assert status == 200 and answer["result"] == "Provisioned"
        # a bound claim needs nothing
        feeds.claims_event("MODIFIED", claim_object("late", {CORE: 10}, uid="u5",
                                                    elastic_gpu="egpu-u5", phase="Bound"))
        status, answer = await post(client, "provision",
                                    {"namespace": "default", "name": "late", "uid": "u5"})
        assert answer == {"result": "NotNeeded", "decision": "Bind", "elasticGPU": "egpu-u5"}
        status, answer = await post(client, "provision", {"namespace": "default", "name": "c1"})
        assert status == 400 and "uid" in answer["Error"]
    fresh = SchedulerState()
    async with TestClient(TestServer(Extender(fresh, api_, claims_api=api_).app())) as client:
        status, answer = await post(client, "provision",
                                    {"namespace": "default", "name": "c1", "uid": "u1"})
        assert status == 503 and "not synced" in answer["Error"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
FIELDS = st.fixed_dictionaries({}, optional={
    "namespace": JSON | st.sampled_from(["default", "", "A", "x" * 300]),
    "name": JSON | st.sampled_from(["c1", "huge", "-x"]),
    "uid": JSON | st.sampled_from(["u1", "", "u" * 200]),
    "extra": JSON})


@settings(max_examples=150, deadline=None)
@given(body=JSON | FIELDS | st.binary(max_size=60))
def test_provision_never_answers_500(body: Any) -> None:
    async def run() -> None:
        state, _ = claim_state()
        api_ = FakeClaimApi()
        async with TestClient(TestServer(Extender(state, api_, claims_api=api_).app())) as client:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = await client.post("/provision", data=data)
            assert response.status in (200, 400, 404), await response.text()
            answer = await response.json()
            if response.status == 200:
                assert answer["result"] in ("Provisioned", "Pending", "NotNeeded")
            else:
                assert answer["Error"]
    asyncio.run(run())


async def test_a_bound_claims_pod_is_bound_with_its_elasticgpus_cards() -> None:
    state, feeds = claim_state()
    feeds.egpus_event("ADDED", elasticgpu_object("egpu-u1", "n2", [share("n2", 0, 400)],
                                                 claim=("default", "c1", "u1")))
    api_ = FakeClaimApi()
    pod = claim_pod("p", {"main": "c1"}, resources={"main": {CORE: "40"}, "side": {CORE: "10"}})
    state.observe_pod(pod)
    async with TestClient(TestServer(Extender(state, api_, claims_api=api_).app())) as client:
        _, answer = await post(client, "bind", {"PodName": "p", "PodNamespace": "default",
                                                      "PodUID": "uid-p", "Node": "n1"})
        assert "bound to ElasticGPU egpu-u1 on node n2" in answer["Error"]
        _, answer = await post(client, "bind", {"PodName": "p", "PodNamespace": "default",
                                                      "PodUID": "uid-p", "Node": "n2"})
        assert answer["Error"] == ""
    assignment = Assignment.from_json(api_.bound["p"][ann.ASSIGNMENT])
    assert assignment.claims == {"main": "egpu-u1"}
    assert assignment.containers["main"] == (share("n2", 0, 400),)
    assert [s.milli for s in assignment.containers["side"]] == [100]
    assert used(state, "n2") == 500  # 400 once (the ElasticGPU) + the side container's 100


async def test_first_consumers_provision_a_wait_for_first_consumer_claim_once() -> None:
    """Two pods naming one WaitForFirstConsumer claim, bound at once: one ElasticGPU is
    created, on the first pod's node with its container's cards; both pods get those cards."""
    state, _ = claim_state("WaitForFirstConsumer")
    api_ = FakeClaimApi()
    api_.gate = asyncio.Event()
    pods = [claim_pod(n, {"main": "c1"}, resources={"main": {CORE: "40"}}) for n in ("a", "b")]
    for pod in pods:
        state.observe_pod(pod)
    async with TestClient(TestServer(Extender(state, api_, claims_api=api_).app())) as client:
        binds = [asyncio.create_task(post(client, "bind", {
            "PodName": n, "PodNamespace": "default", "PodUID": f"uid-{n}", "Node": "n2"}))
            for n in ("a", "b")]
        for _ in range(100):
            if api_.creates:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert api_.creates == 1  # the second waits for the claim's provisioning
        assert used(state, "n2") == 400  # reserved for the ElasticGPU while it is created
        api_.gate.set()
        answers = [await b for b in binds]
    assert [a[1]["Error"] for a in answers] == ["", ""]
    assert api_.creates == 1 and list(api_.egpus) == ["egpu-u1"]
    egpu = api.elasticgpu_from_object(api_.egpus["egpu-u1"])
    assert egpu.node == "n2" and egpu.claim_ref == ClaimRef("default", "c1", "u1")
    for name in ("a", "b"):
        assignment = Assignment.from_json(api_.bound[name][ann.ASSIGNMENT])
        assert assignment.claims == {"main": "egpu-u1"}
        assert assignment.containers["main"] == egpu.shares
    assert used(state, "n2") == 400  # held once, by the ElasticGPU


async def test_a_first_consumer_meeting_an_existing_elasticgpu_uses_its_cards() -> None:
    """A retried bind whose earlier attempt created the ElasticGPU (the cache has not seen it):
    AlreadyExists, so it reads the ElasticGPU and binds the pod with its cards."""
    state, _ = claim_state("WaitForFirstConsumer")
    api_ = FakeClaimApi()
    api_.egpus["egpu-u1"] = elasticgpu_object("egpu-u1", "n1", [share("n1", 0, 400)],
                                              claim=("default", "c1", "u1"), uid="obj-1")
    pod = claim_pod("a", {"main": "c1"}, resources={"main": {CORE: "40"}})
    state.observe_pod(pod)
    async with TestClient(TestServer(Extender(state, api_, claims_api=api_).app())) as client:
        _, answer = await post(client, "bind", {"PodName": "a", "PodNamespace": "default",
                                                      "PodUID": "uid-a", "Node": "n1"})
    assert answer["Error"] == ""
    assignment = Assignment.from_json(api_.bound["a"][ann.ASSIGNMENT])
    assert assignment.containers["main"] == (share("n1", 0, 400),)
    assert used(state, "n1") == 400


# ---- CRDs not installed -------------------------------------------------------------------------


async def test_a_resource_not_served_means_none_exist_and_is_checked_again() -> None:
    """The Elastic GPU API's CRDs missing (404 on the list): the feed says "none" (so the
    extender becomes ready), and lists again later; once served, its objects arrive."""
    from elastic_gpu.kube.informer import Reflector
    from elastic_gpu.kube.transport import ApiStatusError

    class Client:
        def __init__(self) -> None:
            self.lists = 0

        async def list(self, path: str, params: Any) -> tuple[list[dict[str, Any]], str]:
            self.lists += 1
            if self.lists < 3:
                raise ApiStatusError(404, "NotFound", "the server could not find the resource")
            return [{"metadata": {"name": "e1"}}], "5"

        async def watch(self, *args: Any) -> Any:
            await asyncio.sleep(3600)
            yield "ADDED", {}

    replaced: list[list[dict[str, Any]]] = []
    client = Client()
    reflector = Reflector(client, "/apis/elasticgpu.io/v1alpha/elasticgpus",  # type: ignore[arg-type]
                          name="elasticgpus", on_replace=replaced.append,
                          on_event=lambda kind, obj: None, missing_ok=True, missing_retry_s=0.01)
    task = asyncio.create_task(reflector.run())
    try:
        for _ in range(300):
            if len(replaced) >= 3:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert replaced[:3] == [[], [], [{"metadata": {"name": "e1"}}]]


def test_the_agent_serves_a_claim_containers_cards_from_a_marked_assignment() -> None:
    """The agent's Allocate matching reads the new key's assignments unchanged: the claim
    container is served the ElasticGPU's cards, the other container its own."""
    from elastic_gpu.agent.matching import candidates

    pod = consuming_pod("a", "e1", (share("n1", 0, 600),), side=(share("n1", 0, 200),))
    found, problems = candidates([pod], "n1", CORE, 60, ())
    assert problems == [] and [(c.container, c.shares) for c in found] == [
        ("main", (share("n1", 0, 600),))]
    found, _ = candidates([pod], "n1", CORE, 20, ())
    assert [(c.container, c.shares) for c in found] == [("side", (share("n1", 0, 200),))]


NAMES = st.sampled_from(["c1", "c2", "nope", "", "UPPER", "a" * 300, "main", "side"])


@settings(max_examples=80, deadline=None)
@given(notes=st.dictionaries(st.sampled_from([f"egpuc.elasticgpu.io/{c}" for c in
                                               ("main", "side", "x", "")]), NAMES, max_size=3),
       containers=st.lists(st.sampled_from(["main", "side", "other"]), min_size=1, max_size=3,
                           unique=True),
       mode=st.sampled_from(["Immediate", "WaitForFirstConsumer"]),
       bound=st.booleans())
def test_every_verb_answers_pods_naming_claims_without_500(
        notes: dict[str, str], containers: list[str], mode: str, bound: bool) -> None:
    async def run() -> None:
        state, feeds = claim_state(mode)
        if bound:
            feeds.egpus_event("ADDED", elasticgpu_object("egpu-u1", "n2", [share("n2", 0, 400)],
                                                         claim=("default", "c1", "u1")))
        api_ = FakeClaimApi()
        pod = claim_pod("p", {}, resources={c: {CORE: "40"} for c in containers})
        pod["metadata"]["annotations"] = notes
        args = {"Pod": pod, "NodeNames": ["n1", "n2", "n3"]}
        async with TestClient(TestServer(Extender(state, api_, claims_api=api_).app())) as client:
            for verb, body in (("filter", args), ("prioritize", args),
                               ("preempt", {"Pod": pod, "NodeNameToMetaVictims": {
                                   "n2": {"Pods": [], "NumPDBViolations": 0}}}),
                               ("bind", {"PodName": "p", "PodNamespace": "default",
                                         "PodUID": "uid-p", "Node": "n2"})):
                status, answer = await post(client, verb, body)
                assert status in (200, 422), (verb, status, answer)
    asyncio.run(run())


def test_an_elasticgpu_deleted_under_its_running_pod_leaves_the_card_held_by_the_pod() -> None:
    """Issue #26, item 2: the ElasticGPU object goes (an admin, a reclaim that should not have
    happened) while its pod runs; the card is in use all the same, so the pod holds it until
    the pod stops, and nobody else gets it meanwhile."""
    state = ready_state([gpu_node("n1")])
    egpu = elasticgpu_object("e1", "n1", [share("n1", 0, 1000)], claim=("default", "c1", "u1"))
    feed(state, egpus=[egpu])
    pod = consuming_pod("a", "e1", (share("n1", 0, 1000),))
    state.observe_pod(pod)
    assert used(state, "n1") == 1000 and "uid-a" not in state.holds()
    Feeds(state).egpus_event("DELETED", egpu)
    assert used(state, "n1") == 1000  # not freed: the running pod holds it now
    assert state.egpu_holds() == {} and egpu_holds_agree(state)
    assert state.holds()["uid-a"] == Assignment("n1", {"main": (share("n1", 0, 1000),)})
    assert fits(state, 100, ["n1"]) == [] and not state.conflicts()
    # the ElasticGPU comes back (a relist that still has it): counted once, under it again
    feed(state, egpus=[egpu])
    assert used(state, "n1") == 1000 and "uid-a" not in state.holds() and not state.conflicts()
    assert list(state.egpu_holds()) == ["e1"] and egpu_holds_agree(state)
    Feeds(state).egpus_event("DELETED", egpu)
    # the pod stops: the card is free
    stopped = {**pod, "status": {"phase": "Succeeded"},
               "metadata": {**pod["metadata"], "resourceVersion": "9"}}
    state.observe_pod(stopped)
    assert used(state, "n1") == 0 and fits(state, 100, ["n1"]) == ["n1"]


def test_a_pod_being_deleted_frees_its_cards_once_its_containers_have_stopped() -> None:
    """Issue #26, item 3: a finalizer (the budget keeper's) may keep a deleted pod's object
    while `egpu controller` is down; its cards are free as soon as kubelet reports its
    containers terminated, not when the object goes."""
    state = ready_state([gpu_node("n1")])
    pod = pod_manifest("p", uid="uid-p", limits={CORE: "100"})
    pod = with_binding(pod, "n1", Assignment("n1", {"main": (share("n1", 0, 1000),)}))
    state.observe_pod(pod)
    assert used(state, "n1") == 1000

    def version(n: int, status: dict[str, Any]) -> dict[str, Any]:
        return {**pod, "status": status,
                "metadata": {**pod["metadata"], "resourceVersion": str(n),
                             "deletionTimestamp": "2026-11-28T15:00:00Z",
                             "finalizers": ["elasticgpu.io/budget"]}}

    running = {"phase": "Running", "containerStatuses": [
        {"name": "main", "state": {"running": {"startedAt": "2026-11-28T14:00:00Z"}}}]}
    state.observe_pod(version(10, running))
    assert used(state, "n1") == 1000  # deleted, but its container still runs
    waiting = {"phase": "Running", "containerStatuses": [
        {"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    state.observe_pod(version(11, waiting))
    assert used(state, "n1") == 1000  # may be starting right now: statuses lag kubelet
    terminated = {"phase": "Running", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"exitCode": 137}}}]}
    state.observe_pod(version(12, terminated))
    assert used(state, "n1") == 0 and fits(state, 100, ["n1"]) == ["n1"]
