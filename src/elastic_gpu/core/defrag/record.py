"""The defragmentation plan record: the latest plan for a pending pod, as `egpu top` shows it.
Pure, no I/O.

The controller writes it on the pending pod (`elasticgpu.io/defrag-plan`, a system annotation:
the pod-ledger admission policy refuses it from anyone else, so a tenant cannot make `egpu
top` show a plan the controller never made). In report mode it is the plan that would be
carried out; in move mode it is written with the reservation, in the same patch, before the
evictions. It is read only while the pod is not bound: once bound, it means nothing any more.

JSON form (v1), the assignments in `core.assignment`'s form:
    {"v": 1, "mode": "report", "at": "2026-12-01T20:10:05Z",
     "placement": {<the pending pod's planned assignment>},
     "moves": [{"pod": "ml/c", "from": {<assignment>}, "to": {<assignment>}}]}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, AssignmentError
from elastic_gpu.core.defrag.reservation import ReservationError, parse_rfc3339_utc, rfc3339_utc

VERSION = 1
MODES = ("report", "move")
#: moves per record, at most: the controller's `maxMoves` bound
MAX_MOVES = 16
#: `<namespace>/<name>`: a namespace (63) and a pod name (253) at most
MAX_POD_KEY = 317


class PlanRecordError(ValueError):
    """A plan record annotation that cannot be read."""


def describe_cards(assignment: Assignment) -> str:
    """`node n1 card 0,1`; MIG instances are named with their profile: `node n1 card 0
    (MIG 3g.40gb MIG-a1b2)`, since a move between instances may keep the card index."""
    indexes = sorted({s.index for s in assignment.shares()})
    text = f"node {assignment.node} card{'s' if len(indexes) > 1 else ''} " \
           f"{','.join(str(i) for i in indexes)}"
    mig = sorted((s.mig_profile or "", s.mig_uuid) for s in assignment.shares()
                 if s.mig_uuid is not None)
    if mig:
        text += f" (MIG {', '.join(f'{profile} {uuid}' for profile, uuid in mig)})"
    return text


@dataclass(frozen=True)
class PlannedMove:
    pod: str  # `<namespace>/<name>` of the pod moved
    source: Assignment
    target: Assignment

    def describe(self) -> str:
        return f"{self.pod} from {describe_cards(self.source)} to {describe_cards(self.target)}"


@dataclass(frozen=True)
class PlanRecord:
    mode: str  # "report": nothing moved; "move": being carried out
    at: float  # when it was planned (Unix seconds, whole)
    placement: Assignment  # where the pending pod goes once the moves are done
    moves: tuple[PlannedMove, ...]

    def describe(self) -> str:
        """`move 1 pod(s): ml/c from node n1 card 0 to node n0 card 0; then this pod fits on
        node n1 card 0` (the Events' and the log's wording)."""
        moves = "; ".join(m.describe() for m in self.moves)
        return (f"move {len(self.moves)} pod(s): {moves}; then this pod fits on "
                f"{describe_cards(self.placement)}")

    def to_json(self) -> str:
        body = {"v": VERSION, "mode": self.mode, "at": rfc3339_utc(self.at),
                "placement": _assignment_body(self.placement),
                "moves": [{"pod": m.pod, "from": _assignment_body(m.source),
                           "to": _assignment_body(m.target)} for m in self.moves]}
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> PlanRecord:
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise PlanRecordError(f"plan record is not JSON: {err}") from None
        if not isinstance(data, Mapping):
            raise PlanRecordError("plan record must be a JSON object")
        if data.get("v") != VERSION:
            raise PlanRecordError(f"plan record version {data.get('v')!r} is not {VERSION}")
        mode = data.get("mode")
        if mode not in MODES:
            raise PlanRecordError(f"plan record mode {mode!r} is not one of {', '.join(MODES)}")
        try:
            at = parse_rfc3339_utc(data.get("at"), "plan record time")
        except ReservationError as err:
            raise PlanRecordError(str(err)) from None
        moves = data.get("moves")
        if not isinstance(moves, list) or not 1 <= len(moves) <= MAX_MOVES:
            raise PlanRecordError(f"plan record moves must be a list of 1-{MAX_MOVES} moves")
        out = []
        for k, move in enumerate(moves):
            if not isinstance(move, Mapping):
                raise PlanRecordError(f"plan record moves[{k}] must be an object")
            pod = move.get("pod")
            if not isinstance(pod, str) or pod.count("/") != 1 or not 3 <= len(pod) <= MAX_POD_KEY:
                raise PlanRecordError(f"plan record moves[{k}].pod must be <namespace>/<name>")
            out.append(PlannedMove(pod, _assignment(move.get("from"), f"moves[{k}].from"),
                                   _assignment(move.get("to"), f"moves[{k}].to")))
        return PlanRecord(str(mode), at, _assignment(data.get("placement"), "placement"),
                          tuple(out))


def _assignment_body(assignment: Assignment) -> Any:
    return json.loads(assignment.to_json())


def _assignment(body: Any, where: str) -> Assignment:
    if not isinstance(body, Mapping):
        raise PlanRecordError(f"plan record {where} must be an assignment object")
    try:
        return Assignment.from_json(json.dumps(body))
    except AssignmentError as err:
        raise PlanRecordError(f"plan record {where}: {err}") from None


def plan_record(mode: str, at: float, placement: Assignment,
                moves: Sequence[PlannedMove]) -> PlanRecord:
    """The record a plan writes (`at` rounded down to a whole second, the annotation's
    resolution)."""
    return PlanRecord(mode, float(int(at)), placement, tuple(moves))


@dataclass(frozen=True)
class PendingPlan:
    """A pod not bound yet and the latest plan the controller recorded for it."""

    pod: str  # `<namespace>/<name>`
    record: PlanRecord


def pending_plans(pods: Iterable[Mapping[str, Any]]
                  ) -> tuple[list[PendingPlan], list[tuple[str, str]]]:
    """The plans recorded on pods that are not bound (nor being deleted), by pod key; and
    (pod key, why) for each record that cannot be read."""
    plans, bad = [], []
    for pod in pods:
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping) or meta.get("deletionTimestamp"):
            continue
        spec = pod.get("spec")
        if isinstance(spec, Mapping) and spec.get("nodeName"):
            continue
        notes = meta.get("annotations")
        text = notes.get(ann.DEFRAG_PLAN) if isinstance(notes, Mapping) else None
        if text is None:
            continue
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        try:
            plans.append(PendingPlan(key, PlanRecord.from_json(str(text))))
        except PlanRecordError as err:
            bad.append((key, str(err)))
    plans.sort(key=lambda p: p.pod)
    return plans, bad
