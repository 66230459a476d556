"""The webhook's one live read of a pod's ResourceClaims and templates (`webhook.draclaims`):
what it finds feeds the DRA rules, quota and budget and the placement gate alike; the
DeviceClass opt-out of the gate is read for our placed class only, and fails open (issue 41)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.admission.mutators.dra_gate import wants_gate
from elastic_gpu.core.dra.classes import CARD_CLASS, MIG_CLASS
from elastic_gpu.core.dra.podclaims import ClaimRef, PodDraClaims
from elastic_gpu.kube.errors import NotFound
from elastic_gpu.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS
from elastic_gpu.webhook.draclaims import DraClaimReader


def _spec(cls: str) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}


class _Answers:
    """GET answers by path: a dict, or an exception to raise (absent: NotFound)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.paths: list[str] = []

    async def get(self, path: str) -> Any:
        self.paths.append(path)
        answer = self.answers.get(path, NotFound(404, "NotFound", "not found"))
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _read(answers: dict[str, Any], refs: list[ClaimRef]) -> tuple[PodDraClaims, list[str]]:
    reader = DraClaimReader()
    reader.reader = api = _Answers(answers)
    return asyncio.run(reader("team", refs)), api.paths


CLAIM = RESOURCE_CLAIMS.path("team", "c")
TEMPLATE = RESOURCE_CLAIM_TEMPLATES.path("team", "t")
CARDS = DEVICE_CLASSES.path(name=CARD_CLASS)
REFS = [ClaimRef("a", "c", False), ClaimRef("b", "t", True)]


def test_one_read_gives_the_claims_and_the_gate() -> None:
    found, paths = _read({CLAIM: {"spec": _spec(CARD_CLASS)},
                          TEMPLATE: {"spec": {"spec": _spec(MIG_CLASS)}},
                          CARDS: {"metadata": {"name": CARD_CLASS}}}, REFS)
    assert set(found.ours()) == {"a", "b"}
    assert found.classes() == {CARD_CLASS, MIG_CLASS}
    assert wants_gate(found)
    # both classes are placed by us (MIG too): each DeviceClass is read for the opt-out
    assert paths[:2] == [CLAIM, TEMPLATE]
    assert sorted(paths[2:]) == sorted([CARDS, DEVICE_CLASSES.path(name=MIG_CLASS)])


def test_the_operator_opt_out_and_an_unreadable_class_leave_the_pod_ungated() -> None:
    opted = {"metadata": {"annotations": {
        ann.DRA_PLACEMENT: ann.DRA_PLACEMENT_KUBE_SCHEDULER}}}
    found, _ = _read({CLAIM: {"spec": _spec(CARD_CLASS)}, CARDS: opted}, REFS[:1])
    assert found.opted_out == {CARD_CLASS} and not wants_gate(found)
    found, _ = _read({CLAIM: {"spec": _spec(CARD_CLASS)}, CARDS: ConnectionError("down")},
                     REFS[:1])
    assert not wants_gate(found) and set(found.ours()) == {"a"}
    # a class that does not exist is no opt-out
    found, _ = _read({CLAIM: {"spec": _spec(CARD_CLASS)}}, REFS[:1])
    assert wants_gate(found)


def test_a_missing_claim_is_none_and_an_unreadable_one_raises() -> None:
    found, _ = _read({}, REFS[:1])
    assert found.missing() == ["a"] and not wants_gate(found)
    with pytest.raises(ConnectionError):
        _read({CLAIM: ConnectionError("down")}, REFS[:1])
