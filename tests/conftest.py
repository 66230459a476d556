"""Test-run wiring: the fixtures plugin, and how pytest-xdist splits the run into work units.

`scripts/test.sh` (`make test`) runs the suite on `EGPU_TEST_WORKERS` pytest-xdist workers
(`-n N --dist loadgroup`); each worker starts its own control plane (`k8s_cluster` is
session-scoped: one per worker process, on free ports). A work unit goes whole to one worker:

- an integration module is one unit: its module-scoped fixtures (a whole sandbox in
  tests/integration/tenancy, a real node) start once, and its tests keep their written order;
- the modules that run a real kubelet node (`realnode` in the file name: the `real_node` fixture,
  `egpu sandbox up --real-nodes`) are together ONE unit, "real-node": a machine runs one real node
  at a time (the @egpu-realnode lock), and a second would be skipped, not waited for;
- a unit test is a unit of its own: it goes to whichever worker is free.

The units are read from node ids by our own scheduler (`_WorkUnitScheduling`), not from
`xdist_group` marks added at collection: pytest 9.2's structured node ids drop the "@group" suffix
xdist's loadgroup relies on, and the tests are then scattered without a word
(pytest-dev/pytest-xdist#1386). An explicit `xdist_group` mark is still honoured where the suffix
survives. Workers order the collection: the real-node unit first (the longest, started at once),
then the integration modules, then the unit tests, which fill the workers' ends. A serial run
(`EGPU_TEST_WORKERS=1`, or plain `pytest`) keeps the collection order.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

pytest_plugins = ["egpu_testing.pytest_plugin"]

REAL_NODE_UNIT = "real-node"
INTEGRATION_DIR = "tests/integration/"


def work_unit(nodeid: str) -> str:
    """The work unit of a test, from its node id alone (all the xdist controller has)."""
    module = nodeid.split("::", 1)[0]
    if not module.startswith(INTEGRATION_DIR):
        return nodeid
    if "realnode" in PurePosixPath(module).name:
        return REAL_NODE_UNIT
    return module


def _rank(item: pytest.Item) -> int:
    unit = work_unit(item.nodeid)
    return 0 if unit == REAL_NODE_UNIT else 1 if unit != item.nodeid else 2


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ("real_node" in getattr(item, "fixturenames", ())
                and work_unit(item.nodeid) != REAL_NODE_UNIT):
            raise pytest.UsageError(
                f"{item.nodeid} runs a real node but its module is not named *realnode*: "
                "name it so, or parallel runs would start two real nodes and skip one "
                "(tests/conftest.py)")
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike (stable)
        items.sort(key=_rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class _WorkUnitScheduling(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an xdist_group suffix that survived
                return str(super()._split_scope(nodeid))
            return work_unit(nodeid)

    return _WorkUnitScheduling(config, log)
