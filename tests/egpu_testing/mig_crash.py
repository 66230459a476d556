"""`egpu controller ARGS` that SIGKILLs itself right after its first pod DELETE succeeds: the
MIG adapter's crash between deleting a bare pod and re-creating it (issue #16, must-show 3),
at a deterministic point. Test-only: run as a script (`python mig_crash.py ARGS`)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from elastic_gpu.cli.main import app
    from elastic_gpu.kube.client import KubeClient

    original = KubeClient.delete

    async def delete(self: KubeClient, path: str, **kwargs: Any) -> dict[str, Any]:
        out = await original(self, path, **kwargs)
        if "/pods/" in path:
            sys.stderr.write(f"mig_crash: deleted {path}; SIGKILL now\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    KubeClient.delete = delete  # type: ignore[method-assign]
    app(args=["controller", *sys.argv[1:]])


if __name__ == "__main__":
    main()
