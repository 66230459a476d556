"""MIG claims placed by our engine (issues 41/42): the MIG class's requests read by the one
reader, the choices tried in order, the instance the engine's rule picks, and the allocation
written as kube-scheduler's allocator would (device = the instance's slice device)."""

from __future__ import annotations

from typing import Any

from elastic_gpu.core.dra.allocation import allocated_devices
from elastic_gpu.core.dra.claim_placement import (
    allocation,
    best_choice,
    claim_asks,
    claim_assignment,
    mig_choices,
)
from elastic_gpu.core.dra.classes import MIG_CLASS
from elastic_gpu.core.dra.devices import device_table, mig_device, node_slices
from elastic_gpu.core.dra.inventory import claim_hold, claim_key, placeable_cards, tables_of
from elastic_gpu.core.dra.migdemand import gated_for_placement
from elastic_gpu.core.dra.sliceview import node_cards
from elastic_gpu.core.model import Card, MigInstance, MigMode, Node
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.resources import MigProfile

ONE, TWO, THREE = MigProfile(1, 10), MigProfile(2, 20), MigProfile(3, 40)
PROFILE = 'device.attributes["gpu.elasticgpu.io"].profile'


def _card(index: int, profiles: list[tuple[MigProfile, int]]) -> Card:
    return Card(index, f"GPU-{index}", "A100-SXM4-80GB", 81920, mig=tuple(
        MigInstance(p, f"MIG-{index}-{start}", start) for p, start in profiles))


def _engine(slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> Engine:
    """The allocator's engine: the cards read back from the slices, MIG ones included, and
    every allocated claim held (as `scheduler.dra_allocator` builds it)."""
    cards = node_cards(slices)
    engine = Engine(Node(n, 64000, 1 << 19, tuple(cs)) for n, cs in sorted(cards.items()))
    tables = tables_of(cards)
    for claim in claims:
        hold = claim_hold(claim, tables)
        assert hold is not None
        meta = claim["metadata"]
        engine.allocate(claim_key(meta["namespace"], meta["name"]), hold)
    return engine


def _claim(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", **request}]}}}


def _by(expression: str, count: int = 1) -> dict[str, Any]:
    return {"exactly": {"deviceClassName": MIG_CLASS, "count": count,
                        "selectors": [{"cel": {"expression": expression}}]}}


def _held(name: str, device: str) -> dict[str, Any]:
    return {**_claim(name, _by(f'{PROFILE} == "3g.40gb"')), "status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.elasticgpu.io",
                                 "pool": "n", "device": device}]}}}}


def _place(engine: Engine, claim: dict[str, Any], cards: list[Card]) -> dict[str, Any]:
    asks = claim_asks(claim)
    choice = best_choice(engine, "ns", "pod", "uid", [("c", asks)], ["n"])
    assert choice.node == "n"
    assignment = engine.assign(choice.request, "n")
    devices = {i.uuid: mig_device(c.index, i) for c in cards for i in c.mig}
    body = allocation(assignment, "c", asks, {c.index: (c.memory_mib, 100) for c in cards},
                      [], "2026-01-01T00:00:00Z", devices)
    assert claim_assignment(assignment, "c", asks).containers["claim"]
    return body


def test_a_profile_claim_goes_on_the_partly_held_card_where_first_fit_takes_card_0() -> None:
    # card 0: a free 1g only, nothing held; card 1: a 3g held by a claim and a free 1g
    cards = [_card(0, [(ONE, 0)]), _card(1, [(THREE, 4), (ONE, 0)])]
    slices = node_slices("n", cards, generation=1)
    engine = _engine(slices, [_held("held", "gpu-1-mig-4-3g-40gb")])
    body = _place(engine, _claim("c", _by(f'{PROFILE} == "1g.10gb"')), cards)
    (result,) = body["devices"]["results"]
    # not shared: no capacity consumed, no share id (as kube-scheduler writes a MIG device)
    assert result == {"request": "gpu", "driver": "gpu.elasticgpu.io", "pool": "n",
                      "device": "gpu-1-mig-0-1g-10gb"}
    assert body["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n"]
    # the agent reads it back as the instance
    (got,) = allocated_devices({"status": {"allocation": body}}, "n",
                               device_table(node_cards(slices)["n"]))
    assert got.share.mig_uuid == "MIG-1-0"


def test_first_available_takes_the_first_subrequest_that_fits_and_names_it() -> None:
    cards = [_card(0, [(THREE, 4), (ONE, 0)])]
    slices = node_slices("n", cards, generation=1)
    engine = _engine(slices, [_held("held", "gpu-0-mig-4-3g-40gb")])
    claim = _claim("c", {"firstAvailable": [
        {"name": "big", "deviceClassName": MIG_CLASS, "selectors": [
            {"cel": {"expression": f'{PROFILE} == "3g.40gb"'}}]},
        {"name": "small", "deviceClassName": MIG_CLASS, "selectors": [
            {"cel": {"expression": f'{PROFILE} == "1g.10gb"'}}]}]})
    (result,) = _place(engine, claim, cards)["devices"]["results"]
    assert (result["request"], result["device"]) == ("gpu/small", "gpu-0-mig-0-1g-10gb")


def test_or_and_memory_bounds_try_their_profiles_in_order() -> None:
    cards = [_card(0, [(TWO, 4), (ONE, 0)])]
    engine = _engine(node_slices("n", cards, generation=1), [])
    either = _claim("c", _by(f'{PROFILE} == "3g.40gb" || {PROFILE} == "2g.20gb"'))
    (result,) = _place(engine, either, cards)["devices"]["results"]
    assert result["device"] == "gpu-0-mig-4-2g-20gb"
    bound = _claim("c", _by('device.capacity["gpu.elasticgpu.io"].memory'
                            '.compareTo(quantity("10Gi")) >= 0'))
    (result,) = _place(engine, bound, cards)["devices"]["results"]
    assert result["device"] == "gpu-0-mig-0-1g-10gb"  # the smallest with the memory


def test_choices_are_bounded_and_nothing_fits_says_whether_an_empty_node_would() -> None:
    asks = claim_asks(_claim("c", _by(f'{PROFILE} in ["1g.10gb", "2g.20gb", "3g.40gb"]')))
    assert [list(c.values()) for c in mig_choices([("c", asks), ("d", asks)])][:2] == [
        [ONE, ONE], [ONE, TWO]]
    cards = [_card(0, [(ONE, 0)])]
    slices = node_slices("n", cards, generation=1)
    engine = _engine(slices, [])
    two = [("c", claim_asks(_claim("c", _by(f'{PROFILE} == "1g.10gb"', count=2))))]
    taken = best_choice(engine, "ns", "p", "u", two, ["n"])
    assert taken.node is None and not taken.fits_empty and not taken.carvable
    # on a node opted in to dynamic MIG it waits for a carve (a profile its model has)
    opted = Engine([Node("n", 64000, 1 << 19, tuple(cards),
                         labels={"elasticgpu.io/mig-dynamic": "true"})])
    assert best_choice(opted, "ns", "p", "u", two, ["n"]).carvable
    never = [("c", claim_asks(_claim("c", _by(f'{PROFILE} == "7g.141gb"'))))]
    assert not best_choice(opted, "ns", "p", "u", never, ["n"]).carvable  # no A100 has it


def test_a_pod_behind_our_gate_is_waiting_demand_for_dynamic_mig() -> None:
    gated = {"metadata": {"name": "p"}, "spec": {"schedulingGates": [
        {"name": "elasticgpu.io/dra-placement"}]}, "status": {"phase": "Pending"}}
    assert gated_for_placement(gated)
    assert not gated_for_placement({**gated, "spec": {"schedulingGates": [{"name": "x"}]}})
    assert not gated_for_placement({**gated, "spec": {**gated["spec"], "nodeName": "n"}})


def test_the_allocator_places_on_card_devices_and_carved_cards_not_a_card_pending_mig() -> None:
    pending = Card(2, "GPU-2", "A100-SXM4-80GB", 81920, mig_mode=MigMode(False, True))
    cards = [Card(0, "GPU-0", "A100-SXM4-80GB", 81920), _card(1, [(ONE, 0)]), pending]
    read = placeable_cards(node_slices("n", cards, generation=1))["n"]
    # the plain card, and the carved one with its instance; the card whose MIG mode waits for
    # a reset is nobody's (kube-scheduler sees its mig-mode taint too)
    assert [(c.index, [i.uuid for i in c.mig]) for c in read] == [(0, []), (1, ["MIG-1-0"])]
