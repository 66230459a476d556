"""`egpu agent ARGS` that SIGKILLs itself right after the fake backend's first MIG instance is
created or destroyed (the step done and, with `fake.migState`, written to the state file; the
slices not yet republished, the MigLayout's status and the card's fence not yet touched): the
real agent process killed mid-change of dynamic MIG (issue 42), at a deterministic point.
Test-only: run as a script (`python real_agent_crash.py agent ARGS`)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from elastic_gpu.agent.backends.fake import FakeBackend
    from elastic_gpu.cli.main import app
    from elastic_gpu.core.mig.apply import Create, Destroy

    original = FakeBackend.apply_mig_step

    def apply_mig_step(self: FakeBackend, card_uuid: str, step: Any) -> Any:
        out = original(self, card_uuid, step)
        if isinstance(step, Create | Destroy):
            sys.stderr.write(f"real_agent_crash: {step} done on {card_uuid}; SIGKILL now\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    FakeBackend.apply_mig_step = apply_mig_step  # type: ignore[method-assign]
    app(args=sys.argv[1:])


if __name__ == "__main__":
    main()
