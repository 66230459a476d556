import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic_gpu.core.assignment import Assignment, AssignmentError, CardShare

shares = st.builds(CardShare, index=st.integers(0, 15), uuid=st.text(min_size=1, max_size=20),
                   milli=st.integers(0, 1000), memory_mib=st.integers(0, 200_000))


@given(st.dictionaries(st.text(min_size=1, max_size=10),
                       st.lists(shares, max_size=4, unique_by=lambda s: s.index), max_size=3))
def test_round_trip(containers: dict[str, list[CardShare]]) -> None:
    original = Assignment("node-1", {k: tuple(v) for k, v in containers.items()})
    assert Assignment.from_json(original.to_json()) == original


def test_mig_share_round_trip() -> None:
    a = Assignment("n", {"c": (CardShare(0, "GPU-0", 0, 0, "1g.10gb", "MIG-1"),)})
    assert Assignment.from_json(a.to_json()) == a


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not json", "not JSON"),
        ("[]", "JSON object"),
        ('{"v": 2, "node": "n", "containers": {}}', "version"),
        ('{"v": 1, "node": "", "containers": {}}', "node name"),
        ('{"v": 1, "node": "n", "containers": []}', "must be an object"),
        ('{"v": 1, "node": "n", "containers": {"c": [{"index": 0}]}}', "lacks"),
        ('{"v": 1, "node": "n", "containers": {"c": [{"index": 0, "uuid": "u", "milli": 1001, '
         '"memoryMiB": 0}]}}', "exceeds one card"),
        ('{"v": 1, "node": "n", "containers": {"c": [{"index": -1, "uuid": "u", "milli": 1, '
         '"memoryMiB": 0}]}}', "non-negative"),
        ('{"v": 1, "node": "n", "containers": {"c": [{"index": 0, "uuid": "u", "milli": 1, '
         '"memoryMiB": 0}, {"index": 0, "uuid": "u", "milli": 1, "memoryMiB": 0}]}}', "twice"),
    ],
)
def test_untrustworthy_annotations_are_errors(text: str, fragment: str) -> None:
    with pytest.raises(AssignmentError, match=fragment):
        Assignment.from_json(text)


def test_json_is_canonical() -> None:
    a = Assignment("n", {"b": (CardShare(1, "u1", 300, 10),), "a": (CardShare(0, "u0", 1000, 0),)})
    assert list(json.loads(a.to_json())["containers"]) == ["a", "b"]
