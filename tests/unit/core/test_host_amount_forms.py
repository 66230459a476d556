"""A pod's CPU and memory read in their plain written forms ("250m", "512Mi", "8Gi") come out
exactly as the exact (Fraction) reading gives them, and every other form still goes through
it (issue 39, "Cost per pod": the extender parses each new pod's requests in its filter)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from elastic_gpu.core.request import _host_amount, _parse_cpu_milli, _parse_memory_mib
from elastic_gpu.core.resources import ResourceError

CPU = ["1m", "250m", "0100m", "999999999999m", "1", "0.5", "1.5m", "2k", "1e3m", "+5m",
       "４m", "m", "1000000000000m", "5Mi"]
MEMORY = ["1Mi", "512Mi", "0Mi", "8Gi", "99999999Gi", "999999999Gi", "999999999999Gi",
          "999999999999Mi", "1.5Gi", "100M", "1Ki", "1Gim", "Gi", "1Ti", "１Gi"]


@pytest.mark.parametrize("text", CPU)
def test_cpu_in_every_form_is_what_the_exact_reading_gives(text: str) -> None:
    assert _outcome(_parse_cpu_milli, text) == _outcome(
        lambda v: _host_amount("cpu", v, Fraction(1000), "milli-CPU"), text)


@pytest.mark.parametrize("text", MEMORY)
def test_memory_in_every_form_is_what_the_exact_reading_gives(text: str) -> None:
    assert _outcome(_parse_memory_mib, text) == _outcome(
        lambda v: _host_amount("memory", v, Fraction(1, 2**20), "MiB"), text)


def _outcome(parse: object, text: str) -> object:
    try:
        return parse(text)  # type: ignore[operator]
    except ResourceError as err:
        return str(err)
