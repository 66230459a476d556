"""Kubernetes resource quantities, parsed exactly.

Kubernetes writes amounts as `<sign><number><suffix>` where the suffix is a binary SI
(Ki, Mi, Gi, Ti, Pi, Ei), a decimal SI (n, u, m, "", k, M, G, T, P, E) or a decimal
exponent (e3, E-2). We parse into `fractions.Fraction` so that `0.5` and `500m` are the
same number and no float rounding can turn a valid request into an invalid one.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity (`"1.5"`, `"500m"`, `"4Gi"`, `"1e3"`) exactly.

    Integers are accepted as they are (YAML `nvidia.com/gpu: 1` arrives as an int); floats are
    accepted only when they are finite, because JSON from some clients carries `0.5`.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is a boolean, not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a finite number")
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity string")
    return _parse_text(value)


@lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    """The string case, memoised: a cluster's pods repeat a handful of quantity strings, and the
    scheduler parses every pod's CPU and memory on every watch event (Fraction is immutable, and
    an error is raised again each time: lru_cache does not store exceptions)."""
    text = value.strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity")
    number = Fraction(match["num"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > 30:
            raise QuantityError(f"{value!r} has an exponent out of range")
        number *= Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        number *= _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    return -number if match["sign"] == "-" else number


def format_quantity(amount: Fraction) -> str:
    """Write a quantity back in the shortest plain form (integers as integers, else milli)."""
    if amount.denominator == 1:
        return str(amount.numerator)
    milli = amount * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(float(amount))
