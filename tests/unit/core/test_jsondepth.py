"""`core.jsondepth`: the nesting of a JSON text, measured on its bytes before any decoding."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_gpu.core.jsondepth import MAX_JSON_DEPTH, json_depth, nesting_refusal, too_deep


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


#: strings full of what a naive count would take for structure: brackets, quotes, backslashes
TRICKY = st.text(alphabet='[]{}"\\ab', max_size=8)
VALUES = st.recursive(st.none() | st.integers() | TRICKY,
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(TRICKY, inner, max_size=3), max_leaves=30)


@settings(max_examples=500, deadline=None)
@given(VALUES, st.booleans())
def test_depth_is_the_decoded_depth(value: Any, spaced: bool) -> None:
    text = json.dumps(value, indent=1 if spaced else None).encode()
    assert json_depth(text) == depth_of(value)


def test_escapes_and_scalars() -> None:
    assert json_depth(b"1") == json_depth(b"") == json_depth(b'"[[["') == 0
    assert json_depth(rb'["\\", [[]]]') == 3  # an escaped backslash does not escape the quote
    assert json_depth(rb'["\"[", {}]') == 2  # an escaped quote does not end the string


def test_the_issue_body_is_measured_without_recursion() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    assert too_deep(body) == 100_000
    refusal = nesting_refusal(body, "request body")
    assert refusal is not None and "100000 levels" in refusal and str(MAX_JSON_DEPTH) in refusal


def test_the_limit_is_inclusive_and_shallow_bodies_skip_the_scan() -> None:
    at_limit = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert too_deep(at_limit) is None
    assert too_deep(b"[" + at_limit + b"]") == MAX_JSON_DEPTH + 1
    # many brackets, little depth: measured, and accepted
    wide = json.dumps([[{"a": [1]}] for _ in range(1000)]).encode()
    assert too_deep(wide) is None and json_depth(wide) == 4
