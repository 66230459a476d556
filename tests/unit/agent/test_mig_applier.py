"""The agent's MIG applier (`agent.miglayout.MigApplier`) over the in-memory API and the fake
backend: it fences the card in its GPUDevice before any change (the extender reads it as
`Health.FENCED`), settles, carves, republishes, unfences and writes the MigLayout's status;
a holder blocks it without a fence left behind; a restarted applier settles again; a layout
the card cannot carry is refused alone."""

from __future__ import annotations

from typing import Any

from egpu_testing.clock import ManualClock
from egpu_testing.memory_api import MemoryApi
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.publish import publish_node
from elastic_gpu.agent.miglayout import MigApplier
from elastic_gpu.api import gpudevice as gd
from elastic_gpu.api import miglayout as ml
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.mig.apply import FENCE_SETTLE_S, Placed
from elastic_gpu.core.model import Card, Health
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.kube.resources import GPUDEVICES, MIG_LAYOUTS, NODES, PODS

NODE = "mig-000"
CARD = "GPU-fake-mig-000-0"
OTHER = "GPU-fake-mig-000-1"
P3 = MigProfile.parse("3g.40gb")
P1 = MigProfile.parse("1g.10gb")
CONFIG = parse_config({"migStrategy": "mixed"})
HOST = {"cpu": "16", "memory": "64Gi", "pods": "110"}


def setup(clock: ManualClock) -> tuple[MemoryApi, FakeBackend, MigApplier]:
    api = MemoryApi()
    api.add(NODES.path(), {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                           "status": {"capacity": dict(HOST), "allocatable": dict(HOST)}})
    cards = [Card(i, f"GPU-fake-{NODE}-{i}", "A100-SXM4-80GB", 81920) for i in range(2)]
    backend = FakeBackend.from_cards(cards, NODE)
    publish_node(api, backend, CONFIG, NODE)  # type: ignore[arg-type]
    applier = MigApplier(api, NODE, backend,  # type: ignore[arg-type]
                         lambda: publish_node(api, backend, CONFIG, NODE),  # type: ignore[arg-type]
                         clock=clock)
    return api, backend, applier


def want(api: MemoryApi, card: str, *placed: Placed, generation: int = 1) -> None:
    body = ml.layout_spec(NODE, card, placed)
    body["metadata"]["generation"] = generation
    api.create(MIG_LAYOUTS.path(), body)


def layout(api: MemoryApi, card: str) -> dict[str, Any]:
    return api.get(MIG_LAYOUTS.path(name=ml.object_name(NODE, card)))


def device(api: MemoryApi, index: int) -> Card:
    return gd.card_from_object(api.get(GPUDEVICES.path(name=gd.object_name(NODE, index))))[1]


def test_fence_settle_carve_unfence_and_status() -> None:
    clock = ManualClock()
    api, backend, applier = setup(clock)
    want(api, CARD, Placed(4, P3))
    assert applier.round() == {CARD: "Fencing"}
    assert device(api, 0).health is Health.FENCED  # nothing new is placed on it
    assert device(api, 1).health is Health.HEALTHY
    assert layout(api, CARD)["status"]["phase"] == "Fencing"
    assert backend.discover()[0].mig == ()  # nothing changes before the fence has settled
    clock.advance(FENCE_SETTLE_S)
    assert applier.round() == {CARD: "Applied"}
    card = device(api, 0)
    assert card.health is Health.HEALTHY and [(m.profile, m.start) for m in card.mig] == [(P3, 4)]
    status = layout(api, CARD)["status"]
    assert status["phase"] == "Applied" and status["observedGeneration"] == 1
    assert status["instances"] == [{"profile": "3g.40gb", "start": 4,
                                    "uuid": f"MIG-{CARD}-3g.40gb-4"}]
    node = api.get(NODES.path(name=NODE))
    assert node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "1"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    writes = len(api.writes)
    listed: list[str] = []
    plain_list = api.list

    def counting_list(path: str, params: Any = None) -> Any:
        listed.append(path)
        return plain_list(path, params)

    api.list = counting_list  # type: ignore[method-assign]
    assert applier.round() == {CARD: "Applied"} and len(api.writes) == writes  # nothing new
    assert PODS.path() not in listed  # the steady state reads no pods


def held_pod(card: str, index: int, mig: str | None = None) -> dict[str, Any]:
    share = CardShare(index, card, 1000 if mig is None else 0, 81920 if mig is None else 40960,
                      "3g.40gb" if mig else None, mig)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "holder", "namespace": "ml", "annotations": {
                ann.ASSIGNMENT: Assignment(NODE, {"main": (share,)}).to_json(),
                ann.ASSIGNED_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
            "status": {"phase": "Running"}}


def test_a_holder_blocks_the_change_and_leaves_no_fence() -> None:
    clock = ManualClock()
    api, backend, applier = setup(clock)
    api.add(PODS.path(), held_pod(OTHER, 1))
    want(api, OTHER, Placed(0, P3))
    assert applier.round() == {OTHER: "Blocked"}
    status = layout(api, OTHER)["status"]
    assert "held by ml/holder" in status["reason"]
    assert device(api, 1).health is Health.HEALTHY and backend.discover()[1].mig == ()


def test_a_bind_landing_while_the_fence_settles_blocks_and_unfences() -> None:
    clock = ManualClock()
    api, backend, applier = setup(clock)
    want(api, CARD, Placed(0, P3))
    assert applier.round() == {CARD: "Fencing"}
    api.add(PODS.path(), held_pod(CARD, 0))  # decided before the fence was seen
    clock.advance(FENCE_SETTLE_S)
    assert applier.round() == {CARD: "Blocked"}
    assert device(api, 0).health is Health.HEALTHY and backend.discover()[0].mig == ()


def test_held_instances_stay_and_a_restarted_applier_settles_again() -> None:
    clock = ManualClock()
    api, backend, applier = setup(clock)
    want(api, CARD, Placed(4, P3))
    applier.round()
    clock.advance(FENCE_SETTLE_S)
    applier.round()
    held = f"MIG-{CARD}-3g.40gb-4"
    api.add(PODS.path(), held_pod(CARD, 0, held))
    api.patch(MIG_LAYOUTS.path(name=ml.object_name(NODE, CARD)),
              {"metadata": {"generation": 2},
               "spec": {"instances": [{"profile": "1g.10gb", "start": 0},
                                      {"profile": "3g.40gb", "start": 4}]}})
    assert applier.round() == {CARD: "Fencing"}
    restarted = MigApplier(api, NODE, backend,  # type: ignore[arg-type]
                           lambda: publish_node(api, backend, CONFIG, NODE),  # type: ignore[arg-type]
                           clock=clock)
    clock.advance(FENCE_SETTLE_S - 1)
    assert restarted.round() == {CARD: "Fencing"}  # its own settle, from its start
    clock.advance(FENCE_SETTLE_S)
    assert restarted.round() == {CARD: "Applied"}
    assert sorted((m.profile.name, m.start, m.uuid) for m in device(api, 0).mig) == [
        ("1g.10gb", 0, f"MIG-{CARD}-1g.10gb-0"), ("3g.40gb", 4, held)]


def test_a_fence_whose_layout_is_deleted_is_removed_even_after_a_restart() -> None:
    clock = ManualClock()
    api, backend, applier = setup(clock)
    want(api, CARD, Placed(4, P3))
    assert applier.round() == {CARD: "Fencing"}
    api.delete(MIG_LAYOUTS.path(name=ml.object_name(NODE, CARD)))
    restarted = MigApplier(api, NODE, backend,  # type: ignore[arg-type]
                           lambda: publish_node(api, backend, CONFIG, NODE),  # type: ignore[arg-type]
                           clock=clock)
    assert restarted.round() == {}
    assert device(api, 0).health is Health.HEALTHY and backend.discover()[0].mig == ()


def test_a_layout_the_card_cannot_carry_is_refused_alone() -> None:
    clock = ManualClock()
    api, _backend, applier = setup(clock)
    want(api, CARD, Placed(2, P3))  # a 3g.40gb starts at 0 or 4 only
    want(api, OTHER, Placed(6, P1))
    phases = applier.round()
    assert phases[CARD] == "Refused"
    assert "may start only at slot 0, 4" in layout(api, CARD)["status"]["reason"]
    assert phases[OTHER] == "Fencing"
    assert device(api, 0).health is Health.HEALTHY


def test_the_device_plugin_agent_re_advertises_a_carved_card() -> None:
    """The running agent's seam (`Agent.layout_changed`, `NodeMode.layout_changed`): after a
    step the cards are rediscovered, the plugins serve `nvidia.com/mig-3g.40gb` and no longer
    the carved card as `nvidia.com/gpu`, and the GPUDevice and the Node's capacity say so."""
    from typing import cast

    from egpu_testing.dynamic_agent import running_agent
    from elastic_gpu.kube.sync import SyncKubeClient

    api = MemoryApi()
    backend = FakeBackend.from_cards(
        [Card(i, f"GPU-fake-{NODE}-{i}", "A100-SXM4-80GB", 81920) for i in range(2)], NODE)
    with running_agent(api, backend, NODE) as agent:
        assert agent.mode.applies_mig_layouts and agent._mig_dynamic()
        clock = ManualClock()
        applier = MigApplier(cast(SyncKubeClient, api), NODE, backend, agent.layout_changed,
                             clock=clock)
        want(api, CARD, Placed(4, P3))
        applier.round()
        clock.advance(FENCE_SETTLE_S)
        assert applier.round() == {CARD: "Applied"}
        served = {plan.resource: plan for plan in agent.current().plans}
        assert "nvidia.com/mig-3g.40gb" in served
        node = api.get(NODES.path(name=NODE))
        assert node["status"]["capacity"]["nvidia.com/mig-3g.40gb"] == "1"
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "1"
        assert [m.profile for m in device(api, 0).mig] == [P3]
        resources = {server.resource for server in agent.mode.manager.servers}  # type: ignore[attr-defined]
        assert "nvidia.com/mig-3g.40gb" in resources


def test_a_step_the_card_refuses_mid_round_is_refused_after_the_round_is_published() -> None:
    """Publishing once per round (the running agent): the card takes its first step (its
    1g.10gb destroyed) and refuses the next (the 3g.40gb); `Refused` is written only after the
    step it took is published, so who reads the phase finds the card as it is, not as it was."""
    from elastic_gpu.agent.backends.base import BackendError
    from elastic_gpu.core.mig.apply import Create

    clock = ManualClock()
    api, backend, _ = setup(clock)
    backend.apply_mig_step(CARD, Create(Placed(0, P1)))
    publish_node(api, backend, CONFIG, NODE)  # type: ignore[arg-type]

    class RefusingCreate(FakeBackend):
        def apply_mig_step(self, card_uuid: str, step: Any) -> Any:
            if isinstance(step, Create):
                raise BackendError("the card refused the instance")
            return backend.apply_mig_step(card_uuid, step)

    refusing = RefusingCreate.from_cards([], NODE)
    refusing.discover = backend.discover  # type: ignore[method-assign]
    published: list[int] = []

    def publish() -> None:
        publish_node(api, backend, CONFIG, NODE)  # type: ignore[arg-type]
        published.append(len(published))

    seen: list[tuple[str, int]] = []  # (phase written, publications by then)
    patch = api.patch

    def recording_patch(path: str, body: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if path.startswith(MIG_LAYOUTS.path()):
            seen.append((body["status"]["phase"], len(published)))
        return patch(path, body, *args, **kwargs)

    api.patch = recording_patch  # type: ignore[method-assign]
    applier = MigApplier(api, NODE, refusing, publish,  # type: ignore[arg-type]
                         clock=clock, publish_each_step=False)
    want(api, CARD, Placed(4, P3))
    applier.round()
    clock.advance(FENCE_SETTLE_S)
    assert applier.round() == {CARD: "Refused"}
    assert "refused the instance" in layout(api, CARD)["status"]["reason"]
    assert seen[-1] == ("Refused", 1)  # the destroy published before the phase, once
    assert published == [0]
    assert device(api, 0).mig == ()  # the slices say the card without its old instance
