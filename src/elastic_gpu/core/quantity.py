r"""Kubernetes resource quantities, parsed exactly.

Kubernetes writes amounts as `<sign><number><suffix>` where the suffix is a binary SI
(Ki, Mi, Gi, Ti, Pi, Ei), a decimal SI (n, u, m, "", k, M, G, T, P, E) or a decimal
exponent (e3, E-2). We parse into `fractions.Fraction` so that `0.5` and `500m` are the
same number and no float rounding can turn a valid request into an invalid one.

Parsing is strict: only ASCII digits (Python's `\d` also matches '５' and other Unicode
digits), no surrounding spaces, at most `MAX_TEXT` characters, and magnitudes up to
`MAX_QUANTITY` (Kubernetes keeps quantities as scaled 64-bit integers): a 400-digit number or a
JSON integer beyond 64 bits is a clean `QuantityError`, never an overflow further on.
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
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)",
    re.ASCII,
)
#: The largest magnitude a quantity may have (Kubernetes stores them as scaled int64).
MAX_QUANTITY = 2**63 - 1
#: The longest quantity string read (the longest valid int64 with a suffix is ~25 characters).
MAX_TEXT = 64


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity (`"1.5"`, `"500m"`, `"4Gi"`, `"1e3"`) exactly.

    Integers are accepted as they are (YAML `nvidia.com/gpu: 1` arrives as an int); floats are
    accepted only when they are finite, because JSON from some clients carries `0.5`. Booleans
    are refused, and so is any magnitude beyond `MAX_QUANTITY`.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is a boolean, not a quantity")
    if isinstance(value, int):
        return _bounded(Fraction(value), value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a finite number")
        return _bounded(Fraction(str(value)), value)
    if not isinstance(value, str):
        raise QuantityError(f"{_short(value)} is not a quantity string")
    return _parse_text(value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _bounded(number: Fraction, value: object) -> Fraction:
    if abs(number) > MAX_QUANTITY:
        raise QuantityError(f"{_short(value)} is out of range: a quantity's magnitude is at most "
                            f"{MAX_QUANTITY} (64 bits)")
    return number


@lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    """The string case, memoised: a cluster's pods repeat a handful of quantity strings, and the
    scheduler parses every pod's CPU and memory on every watch event (Fraction is immutable, and
    an error is raised again each time: lru_cache does not store exceptions)."""
    if len(value) > MAX_TEXT:
        raise QuantityError(f"{_short(value)} is not a Kubernetes quantity: longer than "
                            f"{MAX_TEXT} characters")
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (an optional sign, ASCII "
                            "digits with an optional fraction, and an optional suffix: Ki Mi Gi "
                            "Ti Pi Ei, n u m k M G T P E, or an exponent such as e3)")
    number = Fraction(match["num"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > 30:
            raise QuantityError(f"{value!r} has an exponent out of range")
        number *= Fraction(10) ** exponent
    else:
        suffix = match["suffix"] or ""
        number *= _BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]
    return _bounded(-number if match["sign"] == "-" else number, value)
