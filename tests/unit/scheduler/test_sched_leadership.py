"""Leader election in the extender: a standby serves and writes nothing, a new leader catches
up with the API's pods before it serves, a lost Lease stops serving at once; the
`leaderElection` settings are checked strictly. (Against the real control plane, with two
extender processes and one SIGKILLed: tests/integration/scheduler/test_sched_failover.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.workbench import ServedExtender, pod_manifest, ready_state
from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.core.model import Card, Node
from elastic_gpu.kube.leaderelection import LeadershipLost, LeaseConfig
from elastic_gpu.scheduler.app import lease_config
from elastic_gpu.scheduler.config import LeaderElectionConfig, load_config
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.handle import BindError
from elastic_gpu.scheduler.leadership import Role, lead
from elastic_gpu.scheduler.worker_link import WorkerLink

NODES = [Node("n0", 64_000, 256_000, (Card(0, "GPU-0", "A100", 16384),))]


class FakeElector:
    """acquire / keep_renewing driven by the test through events."""

    def __init__(self) -> None:
        self.config = LeaseConfig("ns", "lease", "me", 3.0, 2.0, 0.5)
        self.granted = asyncio.Event()
        self.lost = asyncio.Event()

    async def acquire(self) -> None:
        await self.granted.wait()

    async def keep_renewing(self) -> None:
        await self.lost.wait()
        raise LeadershipLost("Lease ns/lease is now held by other")

    def leads_now(self) -> bool:
        return True  # the deadline on the clock: test_kube_leaderelection_deadline.py


class FakeLink:
    def __init__(self, role: Role) -> None:
        self.role = role
        self.writes_allowed = True
        self.resyncs: list[tuple[str, bool, bool]] = []
        self.release = asyncio.Event()

    async def catch_up(self, feed: str, wait_s: float) -> str:
        # what the replica looked like while it caught up: neither serving nor writing
        self.resyncs.append((feed, self.role.serving, self.writes_allowed))
        await self.release.wait()
        return "watch"


class Synced:
    ready = True


async def _until(check: Any) -> None:
    for _ in range(3000):  # 30 s: a loaded machine is slow, the check is not about speed
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_standby_then_catch_up_then_serve_then_stop_at_once_when_the_lease_is_lost(
        ) -> None:
    role = Role(elected=True)
    elector, link = FakeElector(), FakeLink(role)
    task = asyncio.create_task(lead(elector, Synced(), link, role))
    await asyncio.sleep(0.05)
    assert (role.serving, link.writes_allowed) == (False, False)  # a standby
    assert "standing by" in role.refusal
    elector.granted.set()
    await _until(lambda: link.resyncs)
    assert link.resyncs == [("pods", False, False)]  # caught up with the pods first
    assert not role.serving
    link.release.set()
    await _until(lambda: role.serving)
    assert link.writes_allowed
    elector.lost.set()
    with pytest.raises(LeadershipLost):
        await task
    assert (role.serving, link.writes_allowed) == (False, False)


async def test_a_lease_lost_while_catching_up_never_serves() -> None:
    role = Role(elected=True)
    elector, link = FakeElector(), FakeLink(role)
    task = asyncio.create_task(lead(elector, Synced(), link, role))
    elector.granted.set()
    await _until(lambda: link.resyncs)
    elector.lost.set()  # the catch-up never finishes
    with pytest.raises(LeadershipLost):
        await task
    assert not role.serving and not link.writes_allowed


def test_without_leader_election_a_replica_always_serves() -> None:
    role = Role()
    assert role.serving and not role.elected


@pytest.fixture
def standby() -> Iterator[ServedExtender]:
    extender = Extender(ready_state(NODES), role=Role(elected=True))
    served = ServedExtender(extender)
    yield served
    served.stop()


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt", "provision"])
def test_a_standby_answers_every_verb_with_an_error_kube_scheduler_retries(
        standby: ServedExtender, verb: str) -> None:
    pod = pod_manifest("p", uid="u1", limits={"elasticgpu.io/gpu-core": "30"})
    status, body = standby.post(f"/{verb}", {"Pod": pod, "NodeNames": ["n0"]})
    assert status == 503
    assert "does not serve" in body["Error"] and "standing by" in body["Error"]


def test_a_standby_is_not_ready_and_says_whether_its_caches_are_warm(
        standby: ServedExtender) -> None:
    status, text = standby.get("/readyz")
    assert status == 503
    assert "standing by" in text and "caches synced" in text
    assert standby.get("/healthz")[0] == 200


async def test_a_standby_link_refuses_writes_without_sending_them(tmp_path: Path) -> None:
    class Sink:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: None

    link = WorkerLink(None, Sink())
    link.writes_allowed = False
    for call in (link.bind("ns", "p", "u", "n0", None, {}),
                 link.create_elasticgpu({"metadata": {"name": "e"}})):
        with pytest.raises(BindError, match="does not lead") as err:
            await call
        assert err.value.definite  # nothing was sent


def test_lease_settings_default_to_a_fast_failover() -> None:
    election = load_config(None).leader_election
    assert not election.enabled
    config = lease_config(election, "")
    assert (config.lease_duration_s, config.renew_deadline_s, config.retry_period_s) == \
        (2.0, 1.5, 0.5)
    assert config.identity  # hostname_pid


@pytest.mark.parametrize(("text", "needle"), [
    ("leaderElection: {leaseDurationSeconds: 2, renewDeadlineSeconds: 2}\n",
     "must exceed renewDeadlineSeconds"),
    ("leaderElection: {renewDeadlineSeconds: 0.5, retryPeriodSeconds: 0.5}\n",
     "retryPeriodSeconds"),
    ("leaderElection: {enabled: 'yes'}\n", "enabled"),
    ("leaderElection: {leaseName: 'Not A Name'}\n", "leaseName"),
    ("leaderElection: {leaseNamespace: a.b}\n", "leaseNamespace"),
    ("leaderElection: {leaseDurationSecond: 3}\n", "leaseDurationSecond"),
])
def test_bad_lease_settings_are_refused_naming_the_field(tmp_path: Path, text: str,
                                                          needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(path)


def test_lease_settings_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"leaderElection": {
        "enabled": True, "leaseNamespace": "egpu", "leaseName": "sched",
        "leaseDurationSeconds": 4, "renewDeadlineSeconds": 3, "retryPeriodSeconds": 1}}))
    assert load_config(path).leader_election == LeaderElectionConfig(
        enabled=True, lease_namespace="egpu", lease_name="sched", lease_duration_s=4.0,
        renew_deadline_s=3.0, retry_period_s=1.0)


class _Versions:
    """The API worker's client for `catch_up`: a one-item list answering `version`."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.asked: list[dict[str, str]] = []

    async def request(self, method: str, path: str, params: dict[str, str]) -> bytes:
        self.asked.append(params)
        return json.dumps({"metadata": {"resourceVersion": self.version}, "items": []}).encode()


class _Watching:
    def __init__(self, version: str) -> None:
        self.last_resource_version = version


async def test_catch_up_waits_for_the_watch_to_pass_the_version_read_at_takeover() -> None:
    from elastic_gpu.scheduler.apiworker import Worker

    client = _Versions("100")
    worker = Worker(client, lambda message: None)  # type: ignore[arg-type]
    watching = _Watching("90")
    worker.running["pods"] = watching  # type: ignore[assignment]
    relisted: list[str] = []

    async def resync(feed: str) -> None:
        relisted.append(feed)

    worker.resync = resync  # type: ignore[method-assign]
    task = asyncio.create_task(worker.catch_up("pods", wait_s=30))
    await asyncio.sleep(0.05)
    assert not task.done()  # the watch is behind the version the list gave
    watching.last_resource_version = "100"
    assert await task == "watch"
    assert relisted == []
    assert client.asked[0]["limit"] == "1"  # one item: the version is what matters


async def test_catch_up_lists_again_when_the_watch_does_not_move() -> None:
    from elastic_gpu.scheduler.apiworker import Worker

    worker = Worker(_Versions("100"), lambda message: None)  # type: ignore[arg-type]
    worker.running["pods"] = _Watching("99")  # type: ignore[assignment]
    relisted: list[str] = []

    async def resync(feed: str) -> None:
        relisted.append(feed)

    worker.resync = resync  # type: ignore[method-assign]
    assert await worker.catch_up("pods", wait_s=0.05) == "relist"
    assert relisted == ["pods"]
