import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_MEMORY,
    RESOURCE_TABLE,
    Measure,
    MigProfile,
    ResourceError,
    is_gpu_resource,
    lookup,
    to_amount,
)

COMPUTE_NAMES = [s.name for s in RESOURCE_TABLE if s.measure is Measure.COMPUTE]


def test_table_has_every_alias_from_the_design() -> None:
    names = {s.name for s in RESOURCE_TABLE}
    assert {
        "elasticgpu.io/gpu-core", "elasticgpu.io/gpu-memory",
        "gpushare.provisioner.elasticgpu.io/gpu-core", "gpushare.provisioner.elasticgpu.io/gpu-memory",
        "tencent.com/vcuda-core", "tencent.com/vcuda-memory", "nano-gpu/gpu-percent",
        "nvidia.com/gpu", "iluvatar.com/gpu",
    } <= names
    assert len(names) == len(RESOURCE_TABLE), "a name appears twice"


@pytest.mark.parametrize("name", COMPUTE_NAMES)
@given(percent=st.integers(min_value=1, max_value=99))
def test_percent_shares_convert_to_milli(name: str, percent: int) -> None:
    amount = to_amount(name, str(percent))
    assert amount.value == percent * 10
    assert amount.whole_cards == 0


@pytest.mark.parametrize("name", COMPUTE_NAMES)
@given(cards=st.integers(min_value=1, max_value=16))
def test_multiples_of_100_are_whole_cards(name: str, cards: int) -> None:
    assert to_amount(name, cards * 100).whole_cards == cards


@pytest.mark.parametrize("name", COMPUTE_NAMES)
@pytest.mark.parametrize("value", ["0", "150", "101", "-5", "0.5", "50m", "abc"])
def test_bad_percentages_name_resource_value_and_rule(name: str, value: str) -> None:
    with pytest.raises(ResourceError) as info:
        to_amount(name, value)
    message = str(info.value)
    assert name in message and repr(value) in message
    assert "1-99" in message and "multiple of 100" in message


def test_vcuda_memory_is_in_256_mib_units() -> None:
    assert to_amount("tencent.com/vcuda-memory", "4").value == 1024
    assert to_amount(GPU_MEMORY, "4096").value == 4096


def test_memory_with_a_byte_suffix_is_refused_not_misread() -> None:
    # "4Gi" is an integer quantity, and kube-scheduler would count it as 4 * 2**30 MiB.
    for value in ("4Gi", "4096Mi", "1Ki"):
        with pytest.raises(ResourceError, match="byte suffix") as info:
            to_amount(GPU_MEMORY, value)
        assert "MiB" in str(info.value)
    with pytest.raises(ResourceError, match="whole number"):
        to_amount(GPU_MEMORY, "1.5")


@pytest.mark.parametrize(("value", "mib"), [("90k", 90000), ("1e3", 1000), ("4k", 4000), ("16", 16)])
def test_decimal_forms_the_apiserver_writes_back_are_accepted(value: str, mib: int) -> None:
    # The apiserver stores `gpu-memory: "90000"` as "90k" (its canonical decimal form).
    assert to_amount(GPU_MEMORY, value).value == mib


def test_whole_card_names_need_positive_counts() -> None:
    assert to_amount("nvidia.com/gpu", 2).value == 2
    with pytest.raises(ResourceError, match="positive whole number"):
        to_amount("iluvatar.com/gpu", "0")


def test_mig_names_are_recognised() -> None:
    spec = lookup("nvidia.com/mig-3g.40gb")
    assert spec is not None and spec.measure is Measure.MIG
    assert MigProfile.parse("nvidia.com/mig-3g.40gb") == MigProfile(3, 40)
    assert MigProfile.parse("1g.10gb+me").resource_name == "nvidia.com/mig-1g.10gb+me"
    assert not is_gpu_resource("nvidia.com/mig-abc")
    assert not is_gpu_resource("cpu")
    with pytest.raises(ResourceError, match="MIG profile"):
        MigProfile.parse("9g.10gb")


def test_unknown_names_are_refused_clearly() -> None:
    with pytest.raises(ResourceError, match="not a GPU resource"):
        to_amount("example.com/gpu", "1")
    assert is_gpu_resource(GPU_CORE)


@pytest.mark.parametrize("name", ["elasticgpu.io/gpu-core", "elasticgpu.io/gpu-memory",
                                  "nvidia.com/gpu", "tencent.com/vcuda-memory"])
@pytest.mark.parametrize("raw", ["0", "1", "007", "30", "99", "100", "150", "300", "4096",
                                 "999999999999999", "9007199254740993"])
def test_a_plain_digit_string_reads_as_its_integer_does(name: str, raw: str) -> None:
    """`to_amount`'s shortcut for the usual "30" / "4096": the same amount, or the same
    refusal, as the integer itself (the general path)."""
    def outcome(value: str | int) -> object:
        try:
            return to_amount(name, value)
        except ResourceError as err:
            return type(err), str(err).replace(repr(value), "V").replace(str(value), "V")
    assert outcome(raw) == outcome(int(raw))
