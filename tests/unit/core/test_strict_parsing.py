"""Lax input is refused with a message naming field, value and rule (issue 12, item 10).

Every case here was accepted before: Unicode digits matched Python's `\\d`, signs and fractions
went through the generic quantity grammar, JSON numbers of any size became Python ints that
overflowed the engine's int64 arrays later, and a malformed MIG name was "not a GPU resource",
so a pod asking for it fit everywhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from elastic_gpu.core.quantity import MAX_QUANTITY, QuantityError, parse_quantity
from elastic_gpu.core.request import (
    MAX_HOST_REQUEST,
    container_request,
    pod_host_requests,
    pod_request_from_manifest,
)
from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_MEMORY,
    MAX_RESOURCE_VALUE,
    MIG_RULE,
    RESOURCE_TABLE,
    MigProfile,
    ResourceError,
    is_gpu_resource,
    lookup,
    short_repr,
    to_amount,
)
from elastic_gpu.scheduler.schedconfig import MIG_PROFILES

ALL_NAMES = [spec.name for spec in RESOURCE_TABLE] + ["nvidia.com/mig-3g.40gb"]

#: Strings that look like numbers to a lax parser and are not GPU resource values.
BAD_STRINGS = [
    "\uff15\uff10",  # full-width "50"
    "\uff15",  # full-width "5"
    "\u0665",  # Arabic-Indic 5
    "+50", "-5", "+0", "1.5", "50.0", "0.5", ".5", "5e-1", "50m", "1e400",
    " 50", "50 ", "50\n", "5 0", "0x10", "1_000", "", "abc", "9" * 400,
]


def _pod(limits: dict[str, Any], *, cpu: Any = None, memory: Any = None) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "main",
                                     "resources": {"limits": limits, "requests": requests}}]}}


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("value", BAD_STRINGS)
def test_gpu_values_are_plain_ascii_counts(name: str, value: str) -> None:
    with pytest.raises(ResourceError) as info:
        to_amount(name, value)
    message = str(info.value)
    spec = lookup(name)
    assert spec is not None
    assert message.startswith(name) and spec.rule.value in message
    assert short_repr(value) in message


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("value", [True, False, 2**70, -(2**70), MAX_RESOURCE_VALUE + 1, 10**400,
                                   float("inf"), float("nan"), 1e300, 1.5, None, [1], {"a": 1}])
def test_json_numbers_must_be_sane_integers(name: str, value: Any) -> None:
    with pytest.raises(ResourceError) as info:
        to_amount(name, value)
    spec = lookup(name)
    assert spec is not None and spec.rule.value in str(info.value)
    assert len(str(info.value)) < 400  # a 400-digit number is not echoed back whole


def test_the_forms_the_apiserver_writes_and_integral_json_numbers_are_accepted() -> None:
    assert to_amount(GPU_MEMORY, "90k").value == 90_000
    assert to_amount(GPU_MEMORY, "1e3").value == 1000
    assert to_amount(GPU_MEMORY, "0100").value == 100
    assert to_amount(GPU_CORE, 50.0).value == 500
    assert to_amount("nvidia.com/gpu", 2).value == 2
    assert to_amount(GPU_MEMORY, MAX_RESOURCE_VALUE).value == MAX_RESOURCE_VALUE


@pytest.mark.parametrize("name", [
    "nvidia.com/mig-0g.0gb", "nvidia.com/mig-abc.defgb", "nvidia.com/mig-8g.80gb",
    "nvidia.com/mig-0g.10gb", "nvidia.com/mig-3g.0gb", "nvidia.com/mig-3g.040gb",
    "nvidia.com/mig-\uff13g.40gb", "nvidia.com/mig-3g.\uff14\uff10gb", "nvidia.com/mig-1g.10gb+xyz",
    "nvidia.com/mig-1g.10gb+me+me", "nvidia.com/mig-1g.10gb\n", "nvidia.com/mig-",
    "nvidia.com/mig-3g.40", "nvidia.com/mig-3g40gb", "nvidia.com/mig-3G.40GB",
    "nvidia.com/mig-1g.99999gb", "nvidia.com/mig-" + "1" * 300 + "g.10gb",
])
def test_a_malformed_mig_name_is_an_error_not_a_pod_without_gpu(name: str) -> None:
    with pytest.raises(ResourceError) as info:
        lookup(name)
    assert MIG_RULE in str(info.value)
    assert not is_gpu_resource(name)
    with pytest.raises(ResourceError, match="MIG profile is written"):
        container_request("main", {"limits": {name: "1"}})
    with pytest.raises(ResourceError, match="MIG profile is written"):
        pod_request_from_manifest(_pod({name: "1"}))


@pytest.mark.parametrize("profile", [*MIG_PROFILES, "1g.10gb+me", "1g.23gb+me.all", "1g.24gb+gfx",
                                     "7g.141gb", "7g.269gb"])
def test_every_published_profile_parses(profile: str) -> None:
    parsed = MigProfile.parse(profile)
    assert parsed.name == profile
    spec = lookup(parsed.resource_name)
    assert spec is not None and is_gpu_resource(parsed.resource_name)
    request = container_request("main", {"limits": {parsed.resource_name: 1}})
    assert request.mig_profile == parsed


@pytest.mark.parametrize("value", ["\uff11", "1\n", " 1", "1 ", "--1", "+-1", "1e31", "9" * 65,
                                   True, None, 2**63, -(2**63), 9.3e18, float("nan")])
def test_quantities_are_ascii_and_bounded(value: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_quantity_bounds_are_the_64_bit_range() -> None:
    assert parse_quantity(MAX_QUANTITY) == MAX_QUANTITY
    assert parse_quantity(str(MAX_QUANTITY)) == MAX_QUANTITY
    assert parse_quantity("7Ei") == 7 * 2**60
    for beyond in (str(MAX_QUANTITY + 1), "8Ei", MAX_QUANTITY + 1, "-8Ei"):
        with pytest.raises(QuantityError, match="at most"):
            parse_quantity(beyond)


@pytest.mark.parametrize(("field", "value"), [
    ("cpu", "\uff15\uff10\uff10m"), ("cpu", "-1"), ("cpu", 2**70), ("cpu", True), ("cpu", "1e30"),
    ("cpu", "9" * 400), ("cpu", 1e300), ("memory", "-1Gi"), ("memory", 2**70), ("memory", "1e30"),
    ("memory", "\uff11Gi"), ("memory", [1]),
])
def test_host_cpu_and_memory_are_ascii_non_negative_and_bounded(field: str, value: Any) -> None:
    pod = _pod({GPU_CORE: "10"}, **{field: value})
    with pytest.raises(ResourceError) as info:
        pod_host_requests(pod)
    assert str(info.value).startswith(field)
    with pytest.raises(ResourceError):
        pod_request_from_manifest(pod)


def test_host_requests_round_up_and_a_pods_total_is_bounded() -> None:
    assert pod_host_requests(_pod({}, cpu="0.0001", memory="1")) == (1, 1)
    assert pod_host_requests(_pod({}, cpu="+1", memory="1Ei")) == (1000, 2**40)
    at_limit = {"cpu": f"{MAX_HOST_REQUEST}m"}
    one = {"spec": {"containers": [{"name": "a", "resources": {"requests": at_limit}}]}}
    assert pod_host_requests(one) == (MAX_HOST_REQUEST, 0)
    two = {"spec": {"containers": [{"name": n, "resources": {"requests": at_limit}}
                                   for n in ("a", "b")]}}
    with pytest.raises(ResourceError, match="the pod's total"):
        pod_host_requests(two)


def test_a_pods_gpu_total_over_containers_is_bounded() -> None:
    """Each container's 2**53 cards passes its own rule; two of them would overflow the
    engine's 64-bit arithmetic (found by the extender's fuzzing: a 500 from prioritize)."""
    huge = str(2**53)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "a", "resources": {"limits": {"elasticgpu.io/gpu": huge}}},
        {"name": "b", "resources": {"limits": {"elasticgpu.io/gpu": huge}}}]}}
    with pytest.raises(ResourceError, match="a pod's total is at most"):
        pod_request_from_manifest(pod)
    pod["spec"]["containers"].pop()  # type: ignore[index]
    with pytest.raises(ResourceError, match="a pod's total is at most"):
        pod_request_from_manifest(pod)  # 2**53 cards are 2**53 * 1000 milli-cards
    pod["spec"]["containers"][0]["resources"]["limits"]["elasticgpu.io/gpu"] = "1000"  # type: ignore[index]
    assert pod_request_from_manifest(pod).containers[0].cards == 1000
