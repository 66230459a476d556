"""Issue #26's tests: a default sandbox (`egpu sandbox up`, the whole system as a user gets it)
per test module, and tenants bound to `edit` there (`egpu_testing.tenant`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from egpu_testing import sandbox as cli
from egpu_testing.tenant import Tenant, make_tenant


@dataclass(frozen=True)
class Sandbox:
    """A running sandbox: its admin kubeconfig and state directory (`egpu sandbox status
    --state-dir` names every component's pid)."""

    kubeconfig: Path
    state_dir: Path


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    root = tmp_path_factory.mktemp("sandbox")
    box = Sandbox(root / "kubeconfig", root / "state")
    up = cli.egpu("sandbox", "up", "--kubeconfig", str(box.kubeconfig),
                  "--state-dir", str(box.state_dir), timeout=600)
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        yield box
    finally:
        cli.egpu("sandbox", "down", "--state-dir", str(box.state_dir), timeout=300)


_serial = itertools.count()


@pytest.fixture
def tenant(sandbox: Sandbox) -> Callable[[], Tenant]:
    """`tenant()` -> a fresh namespace with a user bound to `edit` there."""

    def make() -> Tenant:
        return make_tenant(sandbox.kubeconfig, f"tenant-{next(_serial)}")

    return make
