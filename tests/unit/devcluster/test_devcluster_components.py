"""The sandbox's component registry and what `down` looks for (no cluster needed)."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from elastic_gpu.core.model import Card, Node
from elastic_gpu.devcluster import components, sandbox
from elastic_gpu.devcluster.components import (
    ComponentEnv,
    ComponentSpec,
    Role,
    Stage,
    extender_missing_nodes,
    scheduler_config,
    select,
)
from elastic_gpu.scheduler.metrics import Metrics

REPO = Path(__file__).resolve().parents[3]


def test_bare_leaves_out_the_elastic_gpu_components_only():
    names = [spec.name for spec in select(components.REGISTRY, bare=False)]
    assert names == ["egpu-scheduler", "egpu-webhook", "egpu-controller", "allocation-sync"]
    # The fake nodes' allocation sync stands in for their agents: it stays in a bare sandbox.
    assert [spec.name for spec in select(components.REGISTRY, bare=True)] == ["allocation-sync"]


def test_a_component_joins_by_one_registry_entry_and_names_stay_unique(tmp_path):
    webhook = ComponentSpec(name="egpu-other", role=Role.SYSTEM, stage=Stage.BEFORE_SCHEDULER,
                            argv=lambda env: [env.python, "-m", "x", "--port", str(env.port)],
                            ready_path="/healthz")
    registry = (*components.REGISTRY, webhook)
    assert [s.name for s in select(registry, bare=False)][-1] == "egpu-other"
    assert "egpu-other" not in [s.name for s in select(registry, bare=True)]
    env = ComponentEnv(kubeconfig=tmp_path / "kc", work_dir=tmp_path, port=1234, python="py")
    assert webhook.argv(env) == ["py", "-m", "x", "--port", "1234"]
    assert components.endpoint(webhook, 1234) == "http://127.0.0.1:1234"
    with pytest.raises(ValueError, match="egpu-other"):
        select((*registry, webhook), bare=False)


def test_controller_calls_the_extender_started_before_it(tmp_path):
    env = ComponentEnv(kubeconfig=tmp_path / "kc", work_dir=tmp_path, port=4322, python="py",
                       endpoints={"egpu-scheduler": "http://127.0.0.1:5555"})
    argv = components.CONTROLLER.argv(env)
    assert argv[:4] == ["py", "-m", "elastic_gpu.cli.main", "controller"]
    assert argv[argv.index("--extender-url") + 1] == "http://127.0.0.1:5555"
    assert argv[argv.index("--metrics-port") + 1] == "4322"
    names = [spec.name for spec in components.REGISTRY]
    assert names.index("egpu-controller") > names.index("egpu-scheduler")


def test_extender_argv_serves_on_its_port_with_the_sandbox_kubeconfig(tmp_path):
    env = ComponentEnv(kubeconfig=tmp_path / "kc", work_dir=tmp_path, port=4321,
                       python=sys.executable)
    argv = components.EXTENDER.argv(env)
    assert argv[:4] == [sys.executable, "-m", "elastic_gpu.cli.main", "scheduler"]
    assert argv[argv.index("--port") + 1] == "4321"
    assert argv[argv.index("--kubeconfig") + 1] == str(tmp_path / "kc")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--config" not in argv  # its defaults, as before --extender-config


def test_extender_argv_passes_the_extender_config_to_every_replica(tmp_path):
    env = ComponentEnv(kubeconfig=tmp_path / "kc", work_dir=tmp_path, port=4321,
                       python=sys.executable, extender_config=tmp_path / "ext.yaml")
    argv = components.EXTENDER.argv(env)
    assert argv[argv.index("--config") + 1] == str(tmp_path / "ext.yaml")
    replicas = [spec for spec in components.with_extender_replicas(components.REGISTRY, 2)
                if spec.name.startswith("egpu-scheduler-")]
    assert len(replicas) == 2
    for spec in replicas:
        argv = spec.argv(env)
        assert argv[argv.index("--config") + 1] == str(tmp_path / "ext.yaml")


def test_kube_scheduler_config_is_the_deployed_one_pointed_at_the_extender():
    deployed = yaml.safe_load((REPO / "deploy/scheduler/kube-scheduler-config.yaml").read_text())
    config = scheduler_config(None, ["http://127.0.0.1:40001"])
    assert config["extenders"][0]["urlPrefix"] == "http://127.0.0.1:40001"
    config["extenders"][0]["urlPrefix"] = deployed["extenders"][0]["urlPrefix"]
    assert config == deployed
    # --bare: kube-scheduler as it comes; --scheduler-config: the user's file as given.
    assert scheduler_config(None, []) == {}
    mine = {"kind": "KubeSchedulerConfiguration", "profiles": [{"schedulerName": "x"}]}
    assert scheduler_config(mine, ["http://127.0.0.1:40001"]) == mine


def _node(name: str, cards: int) -> Node:
    return Node(name=name, cpu_milli=1000, memory_mib=1024,
                cards=tuple(Card(index=i, uuid=f"GPU-{name}-{i}", model="A100", memory_mib=1024)
                            for i in range(cards)))


def test_extender_knows_a_node_once_its_metrics_show_every_card():
    usage = {"a": [(0, 0, 0), (1, 500, 10)], "b": [(0, 0, 0)]}
    text = asyncio.run(Metrics(lambda: usage).page())[0].decode()
    nodes = {"a": 2, "b": 2, "c": 1, "cpu-only": 0}
    # b shows one card of two, c none; a node without cards has nothing to know.
    assert extender_missing_nodes(text, nodes) == ["b", "c"]
    usage["b"].append((1, 0, 0))
    usage["c"] = [(0, 0, 0)]
    text = asyncio.run(Metrics(lambda: usage).page())[0].decode()
    assert extender_missing_nodes(text, nodes) == []
    assert extender_missing_nodes("", {"a": 1}) == ["a"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_down_finds_processes_by_command_line_or_marker_and_ends_them(tmp_path):
    state = tmp_path / "state"
    (state / "cluster").mkdir(parents=True)
    sleeper = [sys.executable, "-c", "import time, sys; time.sleep(600)"]
    by_path = subprocess.Popen([*sleeper, str(state / "cluster" / "x.conf")],
                               start_new_session=True)
    by_marker = subprocess.Popen(sleeper, start_new_session=True,
                                 env={**os.environ, sandbox.MARKER_ENV: str(state)})
    # Naming the state dir itself (e.g. `egpu sandbox status --state-dir DIR`) is not ours.
    bystander = subprocess.Popen([*sleeper, str(state)], start_new_session=True)
    other_marker = subprocess.Popen(sleeper, start_new_session=True,
                                    env={**os.environ, sandbox.MARKER_ENV: str(state) + "2"})
    try:
        time.sleep(0.2)  # exec'd: /proc shows the final command line and environment
        found = sandbox.processes_using(state)
        assert by_path.pid in found and by_marker.pid in found
        assert bystander.pid not in found and other_marker.pid not in found
        assert os.getpid() not in found
        ended = sandbox._end_processes(state, grace_s=2.0)
        assert set(ended) == {by_path.pid, by_marker.pid}
        by_path.wait(5)
        by_marker.wait(5)
        assert sandbox.processes_using(state) == {}
        assert bystander.poll() is None and other_marker.poll() is None
    finally:
        for proc in (by_path, by_marker, bystander, other_marker):
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_down_unmounts_what_is_mounted_under_the_state_dir(tmp_path):
    inner = tmp_path / "state" / "cluster" / "m nt"  # mountinfo escapes the space: \\040
    inner.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inner)], check=True)
    try:
        assert sandbox.mounts_under(tmp_path / "state") == [str(inner)]
        assert sandbox.mounts_under(tmp_path / "stat") == []  # a prefix is not a parent
        sandbox._unmount_under(tmp_path / "state")
        assert sandbox.mounts_under(tmp_path / "state") == []
    finally:
        subprocess.run(["umount", str(inner)], check=False, capture_output=True)


def test_down_without_state_still_ends_processes_of_that_sandbox(tmp_path):
    state = tmp_path / "state"
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True,
                             env={**os.environ, sandbox.MARKER_ENV: str(state)})
    try:
        time.sleep(0.2)
        stopped = sandbox.down(state)
        assert stopped and stopped[0].startswith(f"stray process {stray.pid} ")
        assert stray.wait(5) is not None
        assert sandbox.down(state) == []
    finally:
        stray.kill()
        stray.wait()


def test_status_of_a_dead_sandbox_is_true_to_what_runs(tmp_path):
    """State recorded, processes gone: every component DEAD, nodes unknown, not running."""
    from elastic_gpu.devcluster.controlplane import ControlPlane
    from elastic_gpu.devcluster.process import spawn

    state = tmp_path / "state"
    state.mkdir()
    plane = ControlPlane(work_dir=state / "cluster", bin_dir=tmp_path)
    handle = spawn("egpu-scheduler", [sys.executable, "-c", "pass"],
                   state / "cluster" / "logs" / "egpu-scheduler.log")
    plane.processes[handle.name] = handle
    assert handle._popen is not None
    handle._popen.wait()
    box = sandbox.Sandbox(state, plane, tmp_path / "kc", ["n0"], components={
        "egpu-scheduler": {"port": 1, "endpoint": "http://127.0.0.1:1",
                           "health": "http://127.0.0.1:1/readyz"}})
    box.save()
    info = sandbox.status(state)
    assert info["running"] is False
    comp = info["components"]["egpu-scheduler"]
    assert comp == {"pid": handle.pid, "state": "DEAD", "alive": False,
                    "endpoint": "http://127.0.0.1:1", "log": str(handle.log_path)}
    assert "nodes_ready" not in info and info["nodes_expected"] == 1


def test_webhook_serves_https_on_its_port_with_the_sandbox_kubeconfig(tmp_path):
    env = ComponentEnv(kubeconfig=tmp_path / "kc", work_dir=tmp_path, port=4322,
                       python=sys.executable)
    argv = components.WEBHOOK.argv(env)
    assert argv[:4] == [sys.executable, "-m", "elastic_gpu.cli.main", "webhook"]
    assert argv[argv.index("--port") + 1] == "4322"
    assert argv[argv.index("--kubeconfig") + 1] == str(tmp_path / "kc")
    assert components.endpoint(components.WEBHOOK, 4322) == "https://127.0.0.1:4322"
    assert components.WEBHOOK.stage is Stage.BEFORE_SCHEDULER
    assert components.WEBHOOK.role is Role.SYSTEM


def test_allocation_sync_serves_the_kwok_nodes_metrics_on_its_port(tmp_path):
    env = ComponentEnv(kubeconfig=tmp_path / "kc", work_dir=tmp_path, port=4323,
                       python="py")
    argv = components.ALLOCATION_SYNC.argv(env)
    assert argv[argv.index("--metrics-port") + 1] == "4323"
    assert argv[argv.index("--metrics-host") + 1] == "127.0.0.1"
    # a port is allocated (it serves), recorded as its endpoint, and `up` waits for the page
    assert components.ALLOCATION_SYNC.serves
    assert components.endpoint(components.ALLOCATION_SYNC, 4323) == "http://127.0.0.1:4323"
    assert components.ALLOCATION_SYNC.ready_path == "/metrics"
    assert components.ALLOCATION_SYNC.role is Role.NODE  # still there with --bare


def test_extender_replicas_run_leader_elected_behind_the_readiness_forwarder(tmp_path):
    registry = components.with_extender_replicas(components.REGISTRY, 2)
    names = [spec.name for spec in registry]
    assert names == ["egpu-scheduler-0", "egpu-scheduler-1", "egpu-scheduler",
                     "egpu-webhook", "egpu-controller", "allocation-sync"]
    by_name = {spec.name: spec for spec in registry}
    # kube-scheduler (and the controller, by the name) calls the forwarder, never a replica
    assert [spec.name for spec in registry if spec.extender] == ["egpu-scheduler"]
    env = ComponentEnv(kubeconfig=tmp_path / "kc", work_dir=tmp_path, port=7000,
                       python=sys.executable,
                       endpoints={"egpu-scheduler-0": "http://127.0.0.1:7001",
                                  "egpu-scheduler-1": "http://127.0.0.1:7002"})
    replica = by_name["egpu-scheduler-1"].argv(env)
    assert "--leader-elect" in replica
    assert replica[replica.index("--identity") + 1] == "egpu-sandbox-scheduler-1"
    # a standby is never ready on /readyz: a replica counts as started on /healthz
    assert by_name["egpu-scheduler-1"].ready_path == "/healthz"
    front = by_name["egpu-scheduler"].argv(env)
    assert front[2] == "elastic_gpu.devcluster.readyproxy"
    assert front[front.index("--port") + 1] == "7000"
    assert [front[i + 1] for i, a in enumerate(front) if a == "--backend"] == \
        ["127.0.0.1:7001", "127.0.0.1:7002"]
    assert by_name["egpu-scheduler"].knows_nodes is not None
    assert components.with_extender_replicas(components.REGISTRY, 1) == components.REGISTRY
    with pytest.raises(ValueError, match="not in 1-5"):
        components.with_extender_replicas(components.REGISTRY, 6)
