"""The defragmentation reservation: the cards a plan frees, kept for the pending pod it frees
them for. Pure, no I/O.

The controller writes it on the pending pod (`elasticgpu.io/defrag-reservation`, a system
annotation) before it evicts anything; the extender counts a live one as held by that pod, so
no other pod (a moved pod's replacement first of all) takes those cards, while the pod itself
may. It ends when the pod is bound (its assignment replaces it), stops, or the expiry passes.

Clock rule: the expiry is an absolute wall-clock time (UTC, whole seconds) written by the
controller from its clock and compared by the extender with its own. Clock skew between the
two shifts the reservation's end by the skew; an expiry more than `MAX_AHEAD_S` ahead of the
reader's clock (a skewed or hand-made value) is not counted at all, so a reservation can never
keep cards for longer than that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from elastic_gpu.core.assignment import Assignment, AssignmentError

VERSION = 1
#: The longest a reservation may still have to run, as its reader sees it (seconds). Also the
#: upper bound of the controller's `reservationSeconds`.
MAX_AHEAD_S = 900.0


class ReservationError(ValueError):
    """A reservation annotation that cannot be read."""


def rfc3339_utc(t: float) -> str:
    """Unix seconds as RFC 3339 UTC, whole seconds (the defragmentation annotations' times)."""
    return datetime.fromtimestamp(int(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339_utc(value: Any, what: str = "reservation expiry") -> float:
    """`rfc3339_utc`'s form back to Unix seconds; ValueError (ReservationError) naming `what`
    otherwise."""
    if not isinstance(value, str):
        raise ReservationError(f"{what} {value!r} is not a time")
    try:
        parsed = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise ReservationError(f"{what} {value!r} is not RFC 3339 UTC "
                               "(YYYY-MM-DDTHH:MM:SSZ)") from None
    return parsed.timestamp()


@dataclass(frozen=True)
class DefragReservation:
    """Cards (one pod's assignment, on one node) kept for a pending pod until `expires`
    (Unix seconds)."""

    assignment: Assignment
    expires: float

    def to_json(self) -> str:
        body = {"v": VERSION, "expires": rfc3339_utc(self.expires),
                "assignment": json.loads(self.assignment.to_json())}
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> DefragReservation:
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ReservationError(f"reservation is not JSON: {err}") from None
        if not isinstance(data, Mapping):
            raise ReservationError("reservation must be a JSON object")
        if data.get("v") != VERSION:
            raise ReservationError(f"reservation version {data.get('v')!r} is not {VERSION}")
        body = data.get("assignment")
        if not isinstance(body, Mapping):
            raise ReservationError("reservation assignment must be an object")
        try:
            assignment = Assignment.from_json(json.dumps(body))
        except AssignmentError as err:
            raise ReservationError(f"reservation {err}") from None
        if assignment.claims:
            raise ReservationError("a reservation names no ElasticGPU claims")
        return DefragReservation(assignment, parse_rfc3339_utc(data.get("expires")))


def reservation_for(placement: Assignment, now: float, ttl_s: float) -> DefragReservation:
    """The reservation a plan writes: its pending pod's placement, until `now + ttl_s`
    (rounded up to a whole second, the annotation's resolution)."""
    return DefragReservation(placement, float(int(now + ttl_s + 0.999)))


def live(reservation: DefragReservation | None, *, node_name: str, stopped: bool,
         now: float, max_ahead_s: float = MAX_AHEAD_S) -> bool:
    """Whether `reservation` holds its cards now: the pod is not bound (a bound pod holds its
    assignment instead) nor stopped, the expiry is still ahead, and not further ahead than
    `max_ahead_s` (a skewed clock or a hand-made value never holds cards for long)."""
    if reservation is None or node_name or stopped:
        return False
    return now < reservation.expires <= now + max_ahead_s
