"""`core.defrag.reservation`: the annotation's form and when a reservation holds cards."""

from __future__ import annotations

import json

import pytest

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag.reservation import (
    MAX_AHEAD_S,
    DefragReservation,
    ReservationError,
    live,
    reservation_for,
)

NOW = 1_800_000_000.0
PLACEMENT = Assignment("n1", {"main": (CardShare(0, "GPU-0", 1000, 16384),)})


def test_written_and_read_back() -> None:
    r = reservation_for(PLACEMENT, NOW + 0.2, 120)
    assert r.expires == NOW + 121  # rounded up to the annotation's whole seconds
    text = r.to_json()
    assert json.loads(text)["expires"] == "2027-01-15T08:02:01Z"
    assert DefragReservation.from_json(text) == r


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"), ("[]", "JSON object"), ('{"v": 2}', "version 2"),
    ('{"v": 1, "expires": "2027-01-15T08:00:00Z"}', "assignment must be an object"),
    ('{"v": 1, "expires": "tomorrow", "assignment": {"v": 1, "node": "n", "containers": {}}}',
     "RFC 3339"),
    ('{"v": 1, "expires": 5, "assignment": {"v": 1, "node": "n", "containers": {}}}',
     "not a time"),
    ('{"v": 1, "expires": "2027-01-15T08:00:00Z", "assignment": {"v": 1, "node": ""}}',
     "not a node name"),
])
def test_unreadable_reservations_are_refused(text: str, message: str) -> None:
    with pytest.raises(ReservationError, match=message):
        DefragReservation.from_json(text)


def test_live_only_for_an_unbound_running_pod_before_the_expiry() -> None:
    r = DefragReservation(PLACEMENT, NOW + 120)
    assert live(r, node_name="", stopped=False, now=NOW)
    assert not live(r, node_name="n1", stopped=False, now=NOW)  # bound: its assignment holds
    assert not live(r, node_name="", stopped=True, now=NOW)
    assert not live(r, node_name="", stopped=False, now=NOW + 120)  # expired
    assert not live(None, node_name="", stopped=False, now=NOW)
    far = DefragReservation(PLACEMENT, NOW + MAX_AHEAD_S + 1)  # skewed or hand-made
    assert not live(far, node_name="", stopped=False, now=NOW)
