"""The agent's own MPS control daemons (agent/mps_supervisor.py), against a stand-in daemon
(egpu_testing.mps_standin: forks, writes its pid file, serves `quit`): started with the agent,
one per card with its own pipe and log directories, restarted when it dies, Allocate of the
card refused while it is down (with the reason, also in the card's status reason and the
`elasticgpu_agent_mps_daemon_up` metric), quit when the agent stops."""

from __future__ import annotations

import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.clock import ManualClock
from egpu_testing.mps_standin import daemon_pid, kill_daemon, standin_binary
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.node import DevicePluginNode
from elastic_gpu.agent.matching import AllocateError
from elastic_gpu.agent.metrics import MpsDaemonCollector
from elastic_gpu.agent.mps_supervisor import MpsSupervisor, _running
from elastic_gpu.agent.runtime import Agent
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare

NODE = "n1"
CORE = "elasticgpu.io/gpu-core"
UUIDS = [f"GPU-fake-{NODE}-{i}" for i in range(2)]


class Pods:
    """Pending pods with assignments (the dicts the API returns)."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []

    def add(self, name: str, card: int, core: int = 30) -> None:
        share = CardShare(card, UUIDS[card], core * 10, 0)
        self.pods.append({
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-01-01T00:00:{len(self.pods):02d}Z",
                         "annotations": {ann.ASSIGNMENT: Assignment(NODE, {"main": (share,)})
                                         .to_json(), ann.ASSIGNED_NODE: NODE}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "main", "resources": {"limits": {CORE: str(core)}}}]},
            "status": {"phase": "Pending"}})

    def pending_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["status"]["phase"] == "Pending"]

    on_node = live_on_node = pending_on_node


def plugin_mode(agent: Agent) -> DevicePluginNode:
    """The agent's node mode, which these tests run as device-plugin nodes."""
    assert isinstance(agent.mode, DevicePluginNode)
    return agent.mode


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A unix socket path must stay under 108 bytes: pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="mps", dir="/tmp") as name:
        yield Path(name)


def agent_config(root: Path, check_s: float, probe_s: float = 0) -> Any:
    inventory = root / "inventory.yaml"
    inventory.write_text("cards:\n  - {model: A100, memoryMiB: 40960}\n"
                         "  - {model: A100, memoryMiB: 40960}\n")
    return parse_config({
        "backend": "fake", "fake": {"inventory": str(inventory)},
        "healthCheck": {"enabled": False},
        "sharing": {"mode": "mps", "mps": {
            "pipeDirectory": str(root / "pipe"),
            "daemon": {"binary": str(standin_binary(root)), "logDirectory": str(root / "log"),
                       "shmDirectory": str(root / "shm"),
                       "checkSeconds": check_s, "restartInitialSeconds": 0.01,
                       "restartMaxSeconds": 0.01, "startTimeoutSeconds": 5,
                       "probeSeconds": probe_s, "probeTimeoutSeconds": 0.5}}}})


def make_agent(root: Path, pods: Pods, check_s: float = 300, probe_s: float = 0) -> Agent:
    config = agent_config(root, check_s, probe_s)
    assert config.fake is not None
    return Agent(config, FakeBackend.from_file(config.fake.inventory, NODE), NODE, pods=pods,
                 plugin_dir=root / "plugins")


def allocate(agent: Agent) -> Any:
    (plan,) = [p for p in agent.snapshot.plans if p.resource == CORE]
    return plugin_mode(agent).allocator.allocate(plan, [f"0-{k}" for k in range(30)])


def test_daemons_start_with_the_agent_one_per_card(short_dir: Path) -> None:
    agent = make_agent(short_dir, Pods())
    assert agent.mps is not None
    agent.start()
    try:
        assert agent.mps.up() == dict.fromkeys(UUIDS, True)
        for uuid in UUIDS:
            # Each daemon sees its card only, with its own pipe and log directories.
            log = (short_dir / "log" / uuid / "control.log").read_text()
            assert log.endswith(f"for {uuid}\n")
            assert daemon_pid(short_dir / "pipe" / uuid) is not None
        assert agent.reasons() == {0: "", 1: ""}
        # The agent's /metrics has the daemons' gauge beside its own families.
        port = agent.serve_metrics("127.0.0.1", 0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        for uuid in UUIDS:
            assert f'elasticgpu_agent_mps_daemon_up{{device_uuid="{uuid}",node="{NODE}"}} 1.0' \
                in text
        assert "elasticgpu_agent_card_healthy" in text
    finally:
        agent.stop()


def test_crash_refusal_restart_and_shutdown(short_dir: Path) -> None:
    pods = Pods()
    agent = make_agent(short_dir, pods)
    assert agent.mps is not None
    supervisor = agent.mps
    supervisor.clock = clock = ManualClock()  # the backoff's time passes when the test says
    agent.start()
    try:
        pods.add("a", 0)
        grant = allocate(agent)
        pipe0 = short_dir / "pipe" / UUIDS[0]
        assert [(m.container_path, m.host_path) for m in grant.mounts] == [
            (str(short_dir / "pipe"), str(pipe0)), ("/dev/shm", str(short_dir / "shm"))]
        assert grant.envs["CUDA_MPS_PIPE_DIRECTORY"] == str(short_dir / "pipe")
        assert grant.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"

        # The daemon crashes, and the card is broken enough that it cannot start again.
        (pipe0 / "refuse-start").touch()
        first = kill_daemon(pipe0)
        supervisor.tick()
        assert supervisor.up() == {UUIDS[0]: False, UUIDS[1]: True}
        assert supervisor.starts[UUIDS[0]] == 2  # the first start, and one restart at once
        pods.add("b", 0)
        with pytest.raises(AllocateError, match=rf"{UUIDS[0]}: MPS control daemon down: .*"
                                                r"exited 1: An instance .* cannot start"):
            allocate(agent)
        assert "MPS control daemon down" in agent.reasons()[0] and agent.reasons()[1] == ""
        metric = {s.labels["device_uuid"]: s.value
                  for f in MpsDaemonCollector(NODE, supervisor.up).collect() for s in f.samples}
        assert metric == {UUIDS[0]: 0, UUIDS[1]: 1}

        # The card recovers: the next look after the backoff starts it, Allocate serves again.
        (pipe0 / "refuse-start").unlink()
        clock.advance(1)  # past the backoff (restartMaxSeconds 0.01)
        supervisor.tick()
        assert supervisor.up() == dict.fromkeys(UUIDS, True)
        second = daemon_pid(pipe0)
        assert second is not None and second != first
        assert allocate(agent).mounts[0].host_path == str(pipe0)
        pids = [daemon_pid(short_dir / "pipe" / uuid) for uuid in UUIDS]
    finally:
        agent.stop()
    # Stopping the agent quits the daemons (told `quit`: their pid files go with them).
    assert all(pid is not None and not _running(pid) for pid in pids)
    assert [daemon_pid(short_dir / "pipe" / uuid) for uuid in UUIDS] == [None, None]


def test_the_watch_restarts_a_killed_daemon_on_its_own(short_dir: Path) -> None:
    agent = make_agent(short_dir, Pods(), check_s=0.05)
    assert agent.mps is not None
    agent.start()
    try:
        pipe1 = short_dir / "pipe" / UUIDS[1]
        first = kill_daemon(pipe1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pid = daemon_pid(pipe1)
            if pid not in (None, first) and agent.mps.up()[UUIDS[1]]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"no new daemon for {UUIDS[1]}: {agent.mps.up()}")
        assert agent.mps.starts[UUIDS[1]] == 2
    finally:
        agent.stop()


def test_a_missing_binary_is_a_down_daemon_with_the_reason(short_dir: Path) -> None:
    config = agent_config(short_dir, 300).sharing.mps.daemon
    assert config is not None
    missing = config.model_copy(update={"binary": str(short_dir / "no-such-mps-control")})
    supervisor = MpsSupervisor(UUIDS[:1], str(short_dir / "pipe"), missing)
    supervisor.tick()
    assert supervisor.up() == {UUIDS[0]: False}
    refusal = supervisor.refusal(UUIDS[:1])
    assert refusal is not None and "no-such-mps-control" in refusal
    supervisor.stop()


def test_without_the_daemon_section_the_operator_runs_mps(short_dir: Path) -> None:
    # Today's mps mode: one node-wide pipe directory, nothing started by the agent.
    config = agent_config(short_dir, 300)
    plain = config.model_copy(update={"sharing": parse_config(
        {"sharing": {"mode": "mps"}}).sharing})
    assert plain.fake is not None
    agent = Agent(plain, FakeBackend.from_file(plain.fake.inventory, NODE), NODE, pods=Pods(),
                  plugin_dir=short_dir / "plugins")
    assert agent.mps is None


def test_a_hung_daemon_is_found_by_its_probe_killed_restarted_and_refused_meanwhile(
        short_dir: Path) -> None:
    pods = Pods()
    # Probed at every look: the period is shorter than the second the test's clock moves
    # between looks.
    agent = make_agent(short_dir, pods, probe_s=0.01)
    assert agent.mps is not None
    supervisor = agent.mps
    supervisor.clock = clock = ManualClock()
    agent.start()
    try:
        pipe0 = short_dir / "pipe" / UUIDS[0]
        pods.add("a", 0)
        allocate(agent)
        clock.advance(1)
        supervisor.tick()  # both answer their probe: nothing changes
        assert supervisor.up() == dict.fromkeys(UUIDS, True) and supervisor.hangs[UUIDS[0]] == 0
        first = daemon_pid(pipe0)
        assert first is not None

        # The daemon wedges: its process runs, its socket accepts, it answers nothing. A
        # daemon started on this card wedges too, until the card is fine again.
        (pipe0 / "hang").touch()
        clock.advance(1)
        supervisor.tick()
        assert supervisor.hangs[UUIDS[0]] == 1
        assert not _running(first), "the hung daemon was not killed"
        assert supervisor.starts[UUIDS[0]] == 2  # restarted at once; the new one hung too
        assert supervisor.up() == {UUIDS[0]: False, UUIDS[1]: True}
        assert daemon_pid(pipe0) is None or not _running(daemon_pid(pipe0) or 0)
        pods.add("b", 0)
        with pytest.raises(AllocateError, match=rf"{UUIDS[0]}: MPS control daemon down: started, "
                                                r"but hung: it runs but did not answer "
                                                r"get_default_active_thread_percentage"):
            allocate(agent)
        assert "hung" in agent.reasons()[0] and agent.reasons()[1] == ""
        metric = {s.labels["device_uuid"]: s.value
                  for f in MpsDaemonCollector(NODE, supervisor.up).collect() for s in f.samples}
        assert metric == {UUIDS[0]: 0, UUIDS[1]: 1}

        # The card is fine again: the next look after the backoff starts a daemon that
        # answers, and Allocate serves again.
        (pipe0 / "hang").unlink()
        clock.advance(1)  # past the probe period and the backoff (restartMaxSeconds 0.01)
        supervisor.tick()
        assert supervisor.up() == dict.fromkeys(UUIDS, True)
        second = daemon_pid(pipe0)
        assert second is not None and second != first and _running(second)
        assert allocate(agent).envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    finally:
        agent.stop()


def test_a_daemon_whose_pipe_refuses_the_probe_is_killed_and_replaced(
        short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent = make_agent(short_dir, Pods(), probe_s=0.01)
    assert agent.mps is not None
    agent.start()
    try:
        pipe1 = short_dir / "pipe" / UUIDS[1]
        first = daemon_pid(pipe1)
        assert first is not None
        # Its control socket is gone while its process runs: no client can reach it.
        (pipe1 / "control").unlink()
        with caplog.at_level("ERROR", logger="elastic_gpu.agent.mps_supervisor"):
            agent.mps.tick()
        assert agent.mps.hangs == {UUIDS[0]: 0, UUIDS[1]: 1}
        (said,) = [r.getMessage() for r in caplog.records if UUIDS[1] in r.getMessage()]
        assert "its control pipe refused get_default_active_thread_percentage (exit 1: " \
               "Cannot find MPS control daemon process" in said
        assert f"killed (pid {first}) to be started again" in said
        # Replaced at once by a daemon that answers.
        assert not _running(first)
        second = daemon_pid(pipe1)
        assert second not in (None, first) and agent.mps.up() == dict.fromkeys(UUIDS, True)
    finally:
        agent.stop()
