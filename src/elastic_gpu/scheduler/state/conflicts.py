"""The ledger's hold conflicts: keys (pods, ElasticGPUs) whose assignment or reservation could
not be counted in the engine, why, and on which node; and when to count them again.

A conflict is counted again at every inventory flush (`Ledger.retry_conflicts`) and, so that
cards freed are not left idle or open to another pod meanwhile, as soon as a hold on its node
shrinks or goes (`retry_on`): a defragmentation reservation whose moved pods just left, a pod
whose cards another held. ElasticGPUs first: where one and a pod claim the same card, the
bound claim wins.
"""

from __future__ import annotations

from collections.abc import Callable

from elastic_gpu.scheduler.state.handle import EGPU_KEY

#: passes of `Conflicts.retry_on` over the nodes freed while it counts again
MAX_RETRY_PASSES = 8


def _order(key: str) -> tuple[bool, str]:
    return (not key.startswith(EGPU_KEY), key)


class Conflicts:
    """Keys not (or, a partly held reservation, not wholly) counted: why, and where."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}  # key -> why it could not be counted
        self._on: dict[str, set[str]] = {}  # node -> its keys
        self._node: dict[str, str] = {}  # key -> its node
        self._retrying = False
        self._freed: set[str] = set()

    def __contains__(self, key: object) -> bool:
        return key in self.reasons

    def set(self, key: str, node: str, reason: str) -> None:
        self.clear(key)
        self.reasons[key] = reason
        self._on.setdefault(node, set()).add(key)
        self._node[key] = node

    def clear(self, key: str) -> None:
        self.reasons.pop(key, None)
        node = self._node.pop(key, None)
        if node is not None:
            keys = self._on[node]
            keys.discard(key)
            if not keys:
                del self._on[node]

    def every(self) -> list[str]:
        """Every key, in the order to count them again."""
        return sorted(self.reasons, key=_order)

    def retry_on(self, node: str, count_again: Callable[[str], None]) -> None:
        """A hold on `node` shrank or went: `count_again` each key there. A key counted again
        that frees more (a partly held reservation counted anew) adds its node to the same
        round instead of recursing; the passes are bounded so a cycle cannot spin."""
        if node not in self._on:
            return  # nothing waits there (nearly always: one lookup per hold released)
        if self._retrying:
            self._freed.add(node)
            return
        self._retrying = True
        try:
            pending = {node}
            for _ in range(MAX_RETRY_PASSES):
                for name in sorted(pending):
                    for key in sorted(self._on.get(name, ()), key=_order):
                        if key in self.reasons:
                            count_again(key)
                pending, self._freed = self._freed, set()
                if not pending:
                    break
        finally:
            self._retrying = False
            self._freed.clear()
