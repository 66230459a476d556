"""Issue 42, MIG demand in every shape a claim is written (`core.dra.migselect`, the one reader
of MIG-class requests): a profile by equality, `||` and `in [...]` of profiles (in the order
written), a memory bound (every profile with that much, smallest first: on each model the
first it has is `smallest_profile_for_memory`'s), `&&` and several selectors as their meet,
`firstAvailable`'s MIG subrequests in the order listed; anything else a `SelectorError` naming
it. The quota counts the same reading (the largest accepted)."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.migselect import (
    ALL_PROFILES,
    SelectorError,
    mig_asks,
    selector_profiles,
)
from elastic_gpu.core.dra.quota import Demand, claim_demand
from elastic_gpu.core.mig.profiles import MIG_MODELS, smallest_profile_for_memory

ATTR = 'device.attributes["gpu.elasticgpu.io"].profile'


def memory(quantity: str, cmp: str = ">=") -> str:
    return f'device.capacity["gpu.elasticgpu.io"].memory.compareTo(quantity("{quantity}")) {cmp} 0'


def names(expression: str) -> list[str]:
    return [p.name for p in selector_profiles(expression)]


def sub(expression: str | None, cls: str = MIG_CLASS, count: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if expression is not None:
        out["selectors"] = [{"cel": {"expression": expression}}]
    return out


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def test_an_equality_either_side() -> None:
    assert names(f'{ATTR} == "3g.40gb"') == ["3g.40gb"]
    assert names(f'"1g.10gb"=={ATTR}') == ["1g.10gb"]


def test_profiles_joined_by_or_or_listed_keep_the_order_written() -> None:
    assert names(f'{ATTR} == "2g.20gb" || {ATTR} == "1g.10gb"') == ["2g.20gb", "1g.10gb"]
    assert names(f'({ATTR} == "3g.40gb") || ("1g.10gb" == {ATTR} || {ATTR} == "3g.40gb")') == \
        ["3g.40gb", "1g.10gb"]
    assert names(f'{ATTR} in ["1g.20gb", "2g.20gb"]') == ["1g.20gb", "2g.20gb"]


def test_a_memory_bound_is_every_profile_with_that_much_smallest_first() -> None:
    got = selector_profiles(memory("20Gi"))
    assert got[0].name == "1g.20gb" and all(p.memory_gb >= 20 for p in got)
    assert "1g.10gb" not in names(memory("20Gi")) and "1g.20gb" not in names(memory("20Gi", ">"))
    for model in MIG_MODELS:  # on each model the first it has is the smallest with that memory
        first = next(p for p in got if model.size(p) is not None)
        assert first == smallest_profile_for_memory(20 * 1024, model.name)


def test_and_and_several_selectors_are_their_meet() -> None:
    assert names(f'{memory("30Gi")} && {ATTR} in ["1g.20gb", "3g.40gb"]') == ["3g.40gb"]
    ask = request_ask_of(sub(None) | {"selectors": [
        {"cel": {"expression": memory("30Gi")}},
        {"cel": {"expression": f'{ATTR} in ["1g.20gb", "3g.40gb"]'}}]})
    assert [p.name for p in ask] == ["3g.40gb"]


def request_ask_of(exactly: dict[str, Any]) -> list[Any]:
    asks, problems = mig_asks(spec({"name": "r", "exactly": exactly}))
    assert problems == []
    return list(asks[0].profiles)


@pytest.mark.parametrize("expression", [
    f'{ATTR} != "1g.10gb"', f'{ATTR}.startsWith("1g")', f'{ATTR} == "1g.10gb" ||',
    f'{ATTR} == "big"', f'({ATTR} == "1g.10gb"', 'device.attributes["gpu.elasticgpu.io"].uuid == "MIG-1"',
    memory("lots"), f'{ATTR} == "1g.10gb" {ATTR}'])
def test_anything_else_is_a_selector_error(expression: str) -> None:
    with pytest.raises(SelectorError):
        selector_profiles(expression)


def test_first_available_is_the_mig_subrequests_in_the_order_listed() -> None:
    asks, problems = mig_asks(spec({"name": "r", "firstAvailable": [
        sub(f'{ATTR} == "3g.40gb"'), sub(None, CARD_CLASS), sub(f'{ATTR} == "1g.10gb"')]}))
    assert problems == []
    assert [(a.request, [p.name for p in a.profiles], a.count) for a in asks] == \
        [("r", ["3g.40gb", "1g.10gb"], 1)]


def test_a_request_not_read_is_a_problem_the_others_still_asks() -> None:
    asks, problems = mig_asks(spec(
        {"name": "a", "exactly": sub(f'{ATTR}.startsWith("1g")')},
        {"name": "b", "exactly": sub(f'{ATTR} == "1g.10gb"', count=2)},
        {"name": "c", "firstAvailable": [sub(f'{ATTR} == "1g.10gb"'),
                                         sub(f'{ATTR} == "2g.20gb"', count=2)]},
        {"name": "d", "exactly": sub(memory("500Gi"))},
        {"name": "e", "exactly": {**sub(None), "allocationMode": "All"}},
        {"name": "f", "exactly": sub(None, CARD_CLASS)}))
    assert [(a.request, a.count) for a in asks] == [("b", 2)]
    assert [p.split(":")[0] for p in problems] == \
        ["request a", "request c", "request d", "request e"]
    assert "startsWith" in problems[0] and "[1, 2]" in problems[1]


def test_no_selector_is_any_instance_smallest_first() -> None:
    assert request_ask_of(sub(None)) == list(ALL_PROFILES)


def test_the_quota_counts_the_largest_profile_accepted() -> None:
    either = spec({"name": "r", "exactly": sub(f'{ATTR} == "1g.10gb" || {ATTR} == "3g.40gb"')})
    assert claim_demand(either) == claim_demand(spec(
        {"name": "r", "exactly": sub(f'{ATTR} == "3g.40gb"')}))
    assert claim_demand(spec({"name": "r", "exactly": sub(f'{ATTR}.startsWith("1g")')})) == \
        Demand(100, 0)


def test_the_class_own_selector_repeated_in_a_claim_is_any_profile() -> None:
    driver = 'device.driver == "gpu.elasticgpu.io"'
    assert names(f'{driver} && {ATTR} == "1g.10gb"') == ["1g.10gb"]
    assert names(f'"mig" == device.attributes["gpu.elasticgpu.io"].type && '
                 f'{ATTR} == "2g.20gb"') == ["2g.20gb"]
    assert names(f'device.driver == "other" && {ATTR} == "1g.10gb"') == []
    # the quota's count reads the same: the profile, not a whole card
    assert claim_demand(spec({"name": "r", "exactly": sub(f'{driver} && {ATTR} == "3g.40gb"')})) \
        == claim_demand(spec({"name": "r", "exactly": sub(f'{ATTR} == "3g.40gb"')}))
