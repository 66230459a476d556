"""The fake backend's MIG state file (`FakeConfig.migState`, docs/agent.md "Fake backend
inventory"): every card's MIG instances, written atomically after each MIG step and read at
start, so a fake agent killed mid-change restarts with the layout the card was left with, as
NVML reads a real card's."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from elastic_gpu.agent.files import write_json_atomic
from elastic_gpu.core.mig.apply import placed_of, placement_problems
from elastic_gpu.core.model import Card, MigInstance
from elastic_gpu.core.resources import MigProfile, ResourceError

log = logging.getLogger(__name__)

#: the MIG state file's format version
MIG_STATE_VERSION = 1


def write_mig_state(path: Path, cards: Sequence[Card]) -> None:
    """Every card's MIG instances, atomically (the old file or the new one, never half)."""
    write_json_atomic(path, {"version": MIG_STATE_VERSION, "cards": {
        card.uuid: [{"profile": m.profile.name, "uuid": m.uuid, "start": m.start}
                    for m in card.mig] for card in cards}})


def _instances(raw: Any) -> tuple[MigInstance, ...]:
    if not isinstance(raw, list):
        raise ValueError(f"{raw!r} is not a list of instances")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("start"), int) \
                or not isinstance(item.get("uuid"), str):
            raise ValueError(f"{item!r} is not an instance (profile, uuid, start)")
        out.append(MigInstance(MigProfile.parse(str(item.get("profile"))), item["uuid"],
                               item["start"]))
    return tuple(sorted(out, key=lambda m: (m.start, m.uuid)))


def read_mig_state(path: Path, cards: tuple[Card, ...]) -> tuple[Card, ...]:
    """`cards` with the MIG layouts the state file holds (what the cards were left with); the
    inventory's where the file is missing, unreadable (moved aside) or names a layout the
    card's model does not allow."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != MIG_STATE_VERSION \
                or not isinstance(data.get("cards"), dict):
            raise ValueError(f"not a version-{MIG_STATE_VERSION} MIG state")
    except FileNotFoundError:
        return cards
    except (OSError, ValueError) as err:
        aside = path.with_name(path.name + ".unreadable")
        log.warning("fake MIG state %s is unreadable (%s): moved to %s; the inventory's "
                    "layouts are used", path, err, aside)
        with contextlib.suppress(OSError):
            path.replace(aside)
        return cards
    by_uuid = {card.uuid: card for card in cards}
    for uuid in sorted(set(data["cards"]) - set(by_uuid)):
        log.warning("fake MIG state %s: no card %s in the inventory; ignored", path, uuid)
    out = []
    for card in cards:
        if card.uuid not in data["cards"]:
            out.append(card)
            continue
        try:
            mig = _instances(data["cards"][card.uuid])
        except (ValueError, ResourceError) as err:
            log.warning("fake MIG state %s: card %s: %s; its inventory layout is used",
                        path, card.uuid, err)
            out.append(card)
            continue
        problems = placement_problems(card.model, placed_of(mig)) if mig else []
        if problems:
            log.warning("fake MIG state %s: card %s: %s; its inventory layout is used",
                        path, card.uuid, "; ".join(problems))
            out.append(card)
        else:
            out.append(replace(card, mig=mig))
    return tuple(out)
