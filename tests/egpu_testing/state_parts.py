"""Recording stand-ins for the seams between the scheduler state's parts (the Protocols in
`scheduler/state/`), so that one part can be built and tested alone."""

from __future__ import annotations


class RecordingLedger:
    """`inventory.Recount`: what the inventory asked the ledger to count again, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def recount_all(self) -> None:
        self.calls.append("all")

    def recount_node(self, name: str) -> None:
        self.calls.append(f"node {name}")

    def retry_conflicts(self) -> None:
        self.calls.append("conflicts")


class RecordingFreeing:
    """`inventory.Freeing`: the nodes marked freed, in order."""

    def __init__(self) -> None:
        self.freed: list[str] = []

    def mark_freed(self, node: str) -> None:
        self.freed.append(node)
