"""SIGKILL one component of a running sandbox and start it again, as an outage and its repair
look to the rest of the system (issue #26). Tests only: a user restarts a sandbox with
`egpu sandbox down` / `up`.

The component comes back with the command line it had (same port, same `--identity` for the
controller), recorded in the sandbox's state file, which is updated with the new pid so that
`egpu sandbox status` and `down` see it."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

from egpu_testing.sandbox import alive
from elastic_gpu.devcluster.sandbox import Sandbox


def _load(state_dir: Path) -> Sandbox:
    sandbox = Sandbox.load(state_dir)
    assert sandbox is not None, f"no sandbox in {state_dir}"
    return sandbox


def kill(state_dir: Path, name: str, timeout_s: float = 60.0) -> int:
    """SIGKILL component `name` (nothing it holds is released) and wait until it is gone;
    returns its pid."""
    handle = _load(state_dir).plane.processes[name]
    os.kill(handle.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while alive(handle.pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} (pid {handle.pid}) still alive {timeout_s:.0f} s "
                                 "after SIGKILL")
        time.sleep(0.1)
    return handle.pid


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def restart(state_dir: Path, name: str, timeout_s: float = 180.0) -> int:
    """Start the killed component `name` again with its command line; wait until its health
    URL answers 200 (the controller's /readyz: it leads with synced caches); returns the new
    pid."""
    sandbox = _load(state_dir)
    old = sandbox.plane.processes[name]
    assert not alive(old.pid), f"{name} (pid {old.pid}) is still running"
    handle = sandbox.plane.start_process(name, old.argv)
    sandbox.save()
    health = sandbox.health_url(name)
    deadline = time.monotonic() + timeout_s
    while health and not _ready(health):
        if not handle.alive():
            raise AssertionError(f"{name} exited after its restart:\n{handle.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} not ready at {health} {timeout_s:.0f} s after its "
                                 f"restart:\n{handle.log_tail()}")
        time.sleep(0.2)
    return handle.pid
