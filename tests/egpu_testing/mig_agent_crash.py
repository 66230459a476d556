"""`python -m elastic_gpu.devcluster.allocation_sync ARGS` that SIGKILLs itself right after the
MIG applier's first published step (a MIG instance created or destroyed on a fake card and the
node's GPUDevices written, or on a DRA-mode node its fake inventory and ResourceSlices; the
MigLayout's status and the card's fence not yet): the agent's crash mid-change of dynamic MIG
(issue 42), at a deterministic point. Test-only: run as a
script (`python mig_agent_crash.py ARGS`)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from elastic_gpu.devcluster import allocation_sync, mig_agent

    original = mig_agent.publish_node

    def publish_node(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        sys.stderr.write("mig_agent_crash: a MIG step published; SIGKILL now\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        return out

    original_dra = mig_agent.FakeDraNode.published

    def published(self: mig_agent.FakeDraNode) -> None:  # a DRA node's step: its slices
        original_dra(self)
        sys.stderr.write("mig_agent_crash: a DRA node's MIG step published; SIGKILL now\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    mig_agent.publish_node = publish_node  # type: ignore[assignment]
    mig_agent.FakeDraNode.published = published  # type: ignore[method-assign]
    allocation_sync.app(args=sys.argv[1:])


if __name__ == "__main__":
    main()
