"""The node's live device state: logical cards and their health, shared by all plugins.

Health arrives per physical card (backend events); a logical card is unhealthy while any of
its chips is. Every change bumps `version` and wakes the ListAndWatch streams, which send
the new device list to kubelet.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import replace

from elastic_gpu.agent.backends.base import HealthEvent
from elastic_gpu.agent.devices import LogicalCard
from elastic_gpu.core.model import Health


class NodeState:
    def __init__(self, cards: Iterable[LogicalCard]) -> None:
        self._cond = threading.Condition()
        self._cards = {lc.index: lc for lc in cards}
        self._owner = {chip.uuid: lc.index for lc in self._cards.values() for chip in lc.chips}
        self._chip: dict[str, tuple[Health, str]] = {
            chip.uuid: (chip.health, "") for lc in self._cards.values() for chip in lc.chips}
        self.version = 0

    def replace_cards(self, cards: Iterable[LogicalCard]) -> None:
        """The cards as rediscovered after their MIG layout changed (dynamic MIG): chips keep
        the health seen so far; the plugins' streams are woken."""
        with self._cond:
            self._cards = {lc.index: lc for lc in cards}
            self._owner = {chip.uuid: lc.index for lc in self._cards.values()
                           for chip in lc.chips}
            self._chip = {chip.uuid: self._chip.get(chip.uuid, (chip.health, ""))
                          for lc in self._cards.values() for chip in lc.chips}
            self.version += 1
            self._cond.notify_all()

    def apply(self, events: Iterable[HealthEvent]) -> list[int]:
        """Apply health events; returns the logical cards whose health changed."""
        with self._cond:
            before = self.health()
            for event in events:
                if event.uuid in self._chip:
                    self._chip[event.uuid] = (event.health, event.reason)
            after = self.health()
            changed = [index for index in after if after[index] is not before[index]]
            if changed:
                self.version += 1
                self._cond.notify_all()
            return changed

    def health(self) -> dict[int, Health]:
        with self._cond:
            result = {}
            for index, lc in self._cards.items():
                sick = any(self._chip[chip.uuid][0] is Health.UNHEALTHY for chip in lc.chips)
                result[index] = Health.UNHEALTHY if sick else Health.HEALTHY
            return result

    def reason(self, index: int) -> str:
        with self._cond:
            reasons = [self._chip[chip.uuid][1] for chip in self._cards[index].chips
                       if self._chip[chip.uuid][0] is Health.UNHEALTHY]
            return "; ".join(r for r in reasons if r)

    def cards(self) -> dict[int, LogicalCard]:
        """Logical cards with their current health."""
        health = self.health()
        return {index: LogicalCard(replace(lc.card, health=health[index]),
                                   tuple(replace(chip, health=self._chip[chip.uuid][0])
                                         for chip in lc.chips))
                for index, lc in self._cards.items()}

    def wait_change(self, seen: int, timeout_s: float) -> int:
        """Block until `version` differs from `seen` or the timeout; returns the version."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout=timeout_s)
            return self.version
