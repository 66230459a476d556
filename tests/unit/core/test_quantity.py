from fractions import Fraction

import pytest

from elastic_gpu.core.quantity import QuantityError, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("0.5", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("4Gi", Fraction(4 * 2**30)),
        ("10Mi", Fraction(10 * 2**20)),
        ("2k", Fraction(2000)),
        ("1e3", Fraction(1000)),
        ("5E-1", Fraction(1, 2)),
        ("+7", Fraction(7)),
        ("-2", Fraction(-2)),
        (".5", Fraction(1, 2)),
        (3, Fraction(3)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parses_kubernetes_quantities_exactly(text: str | int | float, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", "1Xi", "Gi", "1 Gi", "1e", True, None, [1], "1e99"])
def test_rejects_malformed_quantities(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)  # type: ignore[arg-type]
