"""The backend contract, run against every backend of the registry (as HAMi's `pkg/device`
tests run each vendor's device through the same cases).

Each backend gets a rig: a way to build it through `backends.registry.make_backend` from one
card table, and to script what its hardware does (a card failing, answering again, the library
missing). NVML runs over a scripted NVML (`egpu_testing.scripted_nvml`), the fake over its YAML
inventory. A case that needs something a backend cannot do checks the backend's declared
capability, and the rig says why it does not apply: no case is skipped.

A new vendor backend adds its registry entry and a rig here; `test_every_backend_has_a_rig`
fails until it does.
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from egpu_testing.clock import ManualClock
from egpu_testing.scripted_nvml import Gpu, SimNvml
from elastic_gpu.agent.backends.base import Backend, BackendError, HealthEvent, Holder
from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION
from elastic_gpu.agent.backends.isolation import ShareLimit
from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.agent.backends.registry import BACKENDS, make_backend
from elastic_gpu.agent.config import (
    AgentConfig,
    BackendKind,
    Preload,
    SharingConfig,
    SharingMode,
    parse_config,
)
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.grant import DeviceFiles, Grant, GrantError, build_grant
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.mig.apply import (
    Create,
    Destroy,
    Fence,
    Holders,
    Placed,
    SetMigMode,
    Unfence,
    next_step,
    placed_of,
)
from elastic_gpu.core.model import Card, Health, MigInstance, MigMode
from elastic_gpu.core.resources import MigProfile
from elastic_gpu.core.usage import ContainerRef


@dataclass(frozen=True)
class MigRow:
    uuid: str
    slices: int
    memory_mb: int
    start: int
    profile: str  # the name the backend must report


@dataclass(frozen=True)
class CardRow:
    uuid: str
    model: str
    memory_mib: int
    numa: int
    mig: tuple[MigRow, ...] = ()


#: The card table every rig builds its backend from.
TABLE = (
    CardRow("GPU-0a0a", "NVIDIA A100-SXM4-80GB", 81920, 0),
    CardRow("GPU-1b1b", "NVIDIA A100-SXM4-80GB", 81920, 1,
            (MigRow("MIG-b-1", 3, 40192, 0, "3g.40gb"), MigRow("MIG-b-2", 1, 9856, 4, "1g.10gb"))),
    CardRow("GPU-2c2c", "NVIDIA T4", 15360, 1),
)


class Capability(enum.Enum):
    MIG = "lists MIG instances"
    UNANSWERING_CARD = "a card can stop answering the driver"
    FAILED_HEALTH_WAIT = "waiting for health events can itself fail"
    ENFORCED_SHARES = "enforces shares (mps sharing mode)"
    MIG_CHANGE = "carves and destroys MIG instances (apply_mig_step)"
    MIG_SURVIVES_RESTART = "a carved layout outlives the backend's process (it is the card's)"


@dataclass
class Rig:
    """One backend under test and the handles that script its hardware."""

    kind: BackendKind
    build: Callable[[], Backend]
    make_unhealthy: Callable[[int], None]
    make_healthy: Callable[[int], None]
    break_library: Callable[[], None]
    #: words the error of a missing library / inventory must contain
    library_words: str
    capabilities: frozenset[Capability]
    #: why each capability the backend lacks does not apply to it
    not_applicable: dict[Capability, str] = field(default_factory=dict)
    card_unanswering: Callable[[int], None] | None = None
    health_wait_fails: Callable[[], None] | None = None
    device_nodes: dict[int, tuple[str, ...]] = field(default_factory=dict)
    control_nodes: tuple[str, ...] = ()
    visible_devices_env: str = "NVIDIA_VISIBLE_DEVICES"
    #: the isolation settings of a 30%/4096 MiB share in mps mode (today's exact env)
    mps_envs: dict[str, str] = field(default_factory=dict)

    def has(self, capability: Capability) -> bool:
        if capability in self.capabilities:
            return True
        # Not a skip: the backend states why the case does not apply to it.
        assert self.not_applicable.get(capability), \
            f"{self.kind.value} lacks {capability.value!r} and does not say why"
        return False


MPS_ENVS = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}
NVIDIA_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def nvml_rig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Rig:
    gpus = [Gpu(row.uuid, row.model, row.memory_mib, f"00000000:{0x3B + i:02X}:00.0", 10 + i,
                mig=[(m.uuid, m.slices, m.memory_mb, m.start) for m in row.mig], numa=row.numa)
            for i, row in enumerate(TABLE)]
    sim = SimNvml(monkeypatch, gpus)
    config = parse_config({"backend": "nvml", "healthCheck": {"recoverAfterSeconds": 60}})
    clock = ManualClock()

    def unanswering(index: int) -> None:
        gpus[index].lost = True

    def wait_fails() -> None:
        sim.wait_error = pynvml.NVML_ERROR_GPU_IS_LOST

    def broken() -> None:
        sim.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND

    return Rig(
        # as registry.make_backend builds it, with a clock the rig moves
        BackendKind.NVML, lambda: NvmlBackend(config.healthCheck, clock=clock),
        make_unhealthy=lambda index: sim.xid(gpus[index], 79),
        # The driver answers for it again: the backend finds out after recoverAfterSeconds.
        make_healthy=lambda index: clock.advance(60),
        break_library=broken, library_words="libnvidia-ml.so.1",
        capabilities=frozenset(Capability),
        card_unanswering=unanswering, health_wait_fails=wait_fails,
        device_nodes={i: (f"/dev/nvidia{10 + i}",) for i in range(len(TABLE))},
        control_nodes=NVIDIA_CONTROL, mps_envs=MPS_ENVS)


def fake_rig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Rig:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "cards": [{"uuid": row.uuid, "model": row.model, "memoryMiB": row.memory_mib,
                   "numaNode": row.numa, "devices": [f"/dev/nvidia{i}"],
                   "mig": [{"profile": m.profile, "uuid": m.uuid, "start": m.start}
                           for m in row.mig]}
                  for i, row in enumerate(TABLE)],
        "controlDevices": list(NVIDIA_CONTROL)}))
    # with its MIG state file, so a carved layout outlives the process as a real card's does
    config = parse_config({"backend": "fake", "fake": {
        "inventory": str(inventory), "migState": str(tmp_path / "state" / "fake-mig.json")}})
    built: list[Any] = []

    def build() -> Backend:
        backend = make_backend(config, "n1")
        built.append(backend)
        return backend

    def set_health(index: int, health: Health) -> None:
        built[-1].set_health(TABLE[index].uuid, health, "XID 79")

    def broken() -> None:
        inventory.unlink()

    return Rig(
        BackendKind.FAKE, build,
        make_unhealthy=lambda index: set_health(index, Health.UNHEALTHY),
        make_healthy=lambda index: set_health(index, Health.HEALTHY),
        break_library=broken, library_words="the fake inventory",
        capabilities=frozenset({Capability.MIG, Capability.ENFORCED_SHARES,
                                Capability.MIG_CHANGE, Capability.MIG_SURVIVES_RESTART}),
        not_applicable={
            Capability.UNANSWERING_CARD: "a fake card has no driver to stop answering; its "
                                         "health is injected",
            Capability.FAILED_HEALTH_WAIT: "the fake's health wait reads a file and "
                                           "injections; a half-written file keeps the last "
                                           "good health instead of failing"},
        device_nodes={i: (f"/dev/nvidia{i}",) for i in range(len(TABLE))},
        control_nodes=NVIDIA_CONTROL, mps_envs=MPS_ENVS)


RIGS: dict[BackendKind, Callable[[pytest.MonkeyPatch, Path], Rig]] = {
    BackendKind.NVML: nvml_rig,
    BackendKind.FAKE: fake_rig,
}


def test_every_backend_has_a_rig() -> None:
    assert set(RIGS) == set(BACKENDS)


@pytest.fixture(params=list(BACKENDS), ids=lambda kind: kind.value)
def rig(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> Iterator[Rig]:
    yield RIGS[request.param](monkeypatch, tmp_path)


def events_until(backend: Backend, uuid: str, health: Health, asks: int = 3
                 ) -> list[HealthEvent]:
    """The health events up to `uuid`'s change to `health`, asked as the agent's health loop
    asks. Every rig has the change ready once it made it (the NVML rig moves the backend's
    clock past `recoverAfterSeconds`), so a few asks find it, with no time to wait out."""
    seen: list[HealthEvent] = []
    for _ in range(asks):
        seen.extend(backend.wait_health(0.01))
        if any(e.uuid == uuid and e.health is health for e in seen):
            return seen
    raise AssertionError(f"no {health.value} event for {uuid}; saw {seen}")


# -- discovery --------------------------------------------------------------------------------


def test_discovery_reads_index_uuid_model_memory_numa(rig: Rig) -> None:
    backend = rig.build()
    cards = backend.discover()
    assert [(c.index, c.uuid, c.model, c.memory_mib, c.numa_node) for c in cards] == [
        (i, row.uuid, row.model, row.memory_mib, row.numa) for i, row in enumerate(TABLE)]
    assert all(c.health is Health.HEALTHY and c.board is None for c in cards)
    assert backend.name == rig.kind.value
    assert backend.visible_devices_env == rig.visible_devices_env
    backend.close()


def test_device_files_per_card_and_for_every_container(rig: Rig) -> None:
    backend = rig.build()
    cards = backend.discover()
    assert {c.index: backend.device_nodes(c) for c in cards} == rig.device_nodes
    assert backend.control_nodes() == rig.control_nodes
    backend.close()


def test_mig_instances_are_listed_with_profile_and_placement(rig: Rig) -> None:
    if not rig.has(Capability.MIG):
        return
    cards = rig.build().discover()
    for card, row in zip(cards, TABLE, strict=True):
        assert [(m.uuid, m.profile.name, m.start) for m in card.mig] == [
            (m.uuid, m.profile, m.start) for m in row.mig]
    assert cards[1].mig_enabled and not cards[0].mig_enabled


# -- health -----------------------------------------------------------------------------------


def test_nothing_happening_is_no_event(rig: Rig) -> None:
    backend = rig.build()
    backend.discover()
    assert backend.wait_health(0.01) == []


def test_a_card_goes_unhealthy_and_back(rig: Rig) -> None:
    backend = rig.build()
    backend.discover()
    assert backend.wait_health(0.01) == []
    rig.make_unhealthy(1)
    events = events_until(backend, TABLE[1].uuid, Health.UNHEALTHY)
    assert [(e.uuid, e.health) for e in events] == [(TABLE[1].uuid, Health.UNHEALTHY)]
    assert "79" in events[0].reason
    assert [c.health for c in backend.discover()] == [
        Health.HEALTHY, Health.UNHEALTHY, Health.HEALTHY]
    rig.make_healthy(1)
    events = events_until(backend, TABLE[1].uuid, Health.HEALTHY)
    assert [(e.uuid, e.health) for e in events] == [(TABLE[1].uuid, Health.HEALTHY)]
    assert all(c.healthy for c in backend.discover())
    backend.close()


def test_a_failed_health_wait_marks_every_card_unhealthy(rig: Rig) -> None:
    if not rig.has(Capability.FAILED_HEALTH_WAIT):
        return
    assert rig.health_wait_fails is not None
    backend = rig.build()
    backend.discover()
    rig.health_wait_fails()
    events = backend.wait_health(0.01)
    assert sorted(e.uuid for e in events) == sorted(row.uuid for row in TABLE)
    assert all(e.health is Health.UNHEALTHY and e.reason for e in events)


# -- errors -----------------------------------------------------------------------------------


def test_a_missing_library_is_a_clear_error(rig: Rig) -> None:
    rig.break_library()
    with pytest.raises(BackendError, match=rig.library_words.replace(".", r"\.")):
        rig.build().discover()


def test_a_card_that_does_not_answer_is_left_out(rig: Rig) -> None:
    if not rig.has(Capability.UNANSWERING_CARD):
        return
    assert rig.card_unanswering is not None
    rig.card_unanswering(1)
    cards = rig.build().discover()
    assert [c.uuid for c in cards] == [TABLE[0].uuid, TABLE[2].uuid]


# -- MIG layouts (issue 42) -------------------------------------------------------------------


def _layout(card: Card) -> list[str]:
    return [str(p) for p in placed_of(card.mig)]


def test_a_whole_card_is_carved_and_discovery_sees_it(rig: Rig) -> None:
    if not rig.has(Capability.MIG_CHANGE):
        return
    backend = rig.build()
    backend.discover()
    uuid = TABLE[0].uuid
    backend.apply_mig_step(uuid, Create(Placed(0, MigProfile.parse("3g.40gb"))))
    after = backend.apply_mig_step(uuid, Create(Placed(4, MigProfile.parse("1g.10gb"))))
    assert [str(p) for p in placed_of(after)] == ["3g.40gb@0", "1g.10gb@4"]
    assert len({m.uuid for m in after}) == 2
    card = backend.discover()[0]
    assert _layout(card) == ["3g.40gb@0", "1g.10gb@4"] and card.mig_enabled
    assert {m.uuid for m in card.mig} == {m.uuid for m in after}


def test_an_instance_is_destroyed_and_the_others_stay(rig: Rig) -> None:
    if not rig.has(Capability.MIG_CHANGE):
        return
    backend = rig.build()
    cards = backend.discover()
    gone = next(m for m in cards[1].mig if m.uuid == "MIG-b-2")
    after = backend.apply_mig_step(TABLE[1].uuid, Destroy(gone))
    assert [m.uuid for m in after] == ["MIG-b-1"]
    assert [m.uuid for m in backend.discover()[1].mig] == ["MIG-b-1"]


def test_what_the_card_cannot_do_is_refused_and_changes_nothing(rig: Rig) -> None:
    if not rig.has(Capability.MIG_CHANGE):
        return
    backend = rig.build()
    cards = backend.discover()
    overlapping = Create(Placed(0, MigProfile.parse("2g.20gb")))  # MIG-b-1 is 3g.40gb@0
    with pytest.raises(BackendError):
        backend.apply_mig_step(TABLE[1].uuid, overlapping)
    with pytest.raises(BackendError):  # a T4 has no MIG
        backend.apply_mig_step(TABLE[2].uuid, Create(Placed(0, MigProfile.parse("1g.10gb"))))
    stranger = MigInstance(MigProfile.parse("1g.10gb"), "MIG-nobody", 6)
    with pytest.raises(BackendError, match="MIG-nobody"):
        backend.apply_mig_step(TABLE[1].uuid, Destroy(stranger))
    assert backend.discover() == cards


def test_steps_from_next_step_reach_the_wanted_layout_across_restarts(rig: Rig) -> None:
    """The agent's loop in small: each step decided from the card's real layout; with a
    backend whose layout is the card's, the backend is rebuilt between steps (a killed agent)."""
    if not rig.has(Capability.MIG_CHANGE):
        return
    restart = rig.has(Capability.MIG_SURVIVES_RESTART)
    backend = rig.build()
    wanted = [Placed(0, MigProfile.parse("2g.20gb")), Placed(2, MigProfile.parse("2g.20gb")),
              Placed(4, MigProfile.parse("3g.40gb"))]
    fence = Fence(since=0.0)
    for _ in range(10):
        if restart:
            backend = rig.build()
        card = backend.discover()[1]
        step = next_step(card.model, wanted, card.mig, Holders(), fence, 60.0)
        if isinstance(step, Create | Destroy):
            backend.apply_mig_step(card.uuid, step)
        else:
            assert isinstance(step, Unfence), step
            break
    assert _layout(backend.discover()[1]) == ["2g.20gb@0", "2g.20gb@2", "3g.40gb@4"]


def test_a_card_merged_back_leaves_mig_mode(rig: Rig) -> None:
    """A merge-back: `next_step` destroys every instance, then turns MIG mode off (a backend
    with no mode of its own, the fake's, is out of MIG mode with its last instance). The mode
    is never turned off under instances, nor on a card without MIG."""
    if not rig.has(Capability.MIG_CHANGE):
        return
    backend = rig.build()
    uuid = TABLE[1].uuid
    with pytest.raises(BackendError):
        backend.apply_mig_step(uuid, SetMigMode(False))
    with pytest.raises(BackendError):  # a T4 has no MIG mode
        backend.apply_mig_step(TABLE[2].uuid, SetMigMode(True))
    steps = []
    for _ in range(6):
        card = backend.discover()[1]
        step = next_step(card.model, [], card.mig, Holders(), Fence(since=0.0), 60.0,
                         card.mig_mode)
        steps.append(type(step).__name__)
        if isinstance(step, Create | Destroy | SetMigMode):
            backend.apply_mig_step(card.uuid, step)
        else:
            assert isinstance(step, Unfence), step
            break
    card = backend.discover()[1]
    assert card.mig == () and not card.mig_enabled
    assert card.mig_mode in (None, MigMode(current=False, pending=False))
    assert steps[:2] == ["Destroy", "Destroy"] and steps[-1] == "Unfence"


# -- isolation --------------------------------------------------------------------------------


def test_accounting_mode_enforces_nothing(rig: Rig) -> None:
    assert rig.build().isolation(SharingConfig()) is None


def test_mps_mode_gives_the_isolation_settings(rig: Rig) -> None:
    if not rig.has(Capability.ENFORCED_SHARES):
        return
    sharing = AgentConfig.model_validate({"sharing": {"mode": "mps"}}).sharing
    isolation = rig.build().isolation(sharing)
    assert isolation is not None and isolation.name == "mps"
    settings = isolation.settings([ShareLimit(300, 4096, 1)])
    assert dict(settings.envs) == rig.mps_envs
    assert [(m.container_path, m.host_path) for m in settings.mounts] == [
        ("/tmp/nvidia-mps", "/tmp/nvidia-mps")]
    # Two cards: one thread percentage (the smallest share), one memory limit per device.
    two = isolation.settings([ShareLimit(500, 2048, 1), ShareLimit(200, 8192, 2)])
    assert two.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert two.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M,1=4096M,2=4096M"


# -- sampling (observed usage, issue 28) ----------------------------------------------------------
#
# Each backend gets a sampling rig over the same card table: a way to script a process using a
# card (memory, SM share) and memory used by nothing the backend lists (a leaked context). The
# scripted process comes back as `Holder`s to pass to `sample` (the fake's usage model reads
# them; NVML ignores them: the driver lists its processes itself).


@dataclass
class SamplingRig:
    build: Callable[[], Backend]
    #: card index, MiB, SM percent -> the holders to tell `sample`
    use: Callable[[int, int, int], tuple[Holder, ...]]
    leak: Callable[[int, int], None]


def nvml_sampling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SamplingRig:
    gpus = [Gpu(row.uuid, row.model, row.memory_mib, f"00000000:{0x3B + i:02X}:00.0", 10 + i,
                numa=row.numa) for i, row in enumerate(TABLE)]
    SimNvml(monkeypatch, gpus)
    config = parse_config({"backend": "nvml"})

    def use(index: int, mib: int, sm: int) -> tuple[Holder, ...]:
        pid = 4000 + index
        gpus[index].processes.append((pid, mib))
        gpus[index].util = sm
        assert gpus[index].process_util is not None
        gpus[index].process_util.append((pid, sm, 1_000 + index))
        return ()

    def leak(index: int, mib: int) -> None:
        gpus[index].leaked_mib = mib

    return SamplingRig(lambda: make_backend(config, "n1"), use, leak)


def fake_sampling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> SamplingRig:
    inventory = tmp_path / "inventory.yaml"
    cards: list[dict[str, Any]] = [{"uuid": row.uuid, "model": row.model,
                                    "memoryMiB": row.memory_mib} for row in TABLE]
    inventory.write_text(yaml.safe_dump({"cards": cards}))
    # with its MIG state file, so a carved layout outlives the process as a real card's does
    config = parse_config({"backend": "fake", "fake": {
        "inventory": str(inventory), "migState": str(tmp_path / "state" / "fake-mig.json")}})

    def use(index: int, mib: int, sm: int) -> tuple[Holder, ...]:
        annotation = json.dumps({"main": {"memoryMiB": mib, "smPercent": sm}})
        return (Holder(TABLE[index].uuid, ContainerRef("ns", f"p{index}", "main"),
                       {USAGE_ANNOTATION: annotation}),)

    def leak(index: int, mib: int) -> None:
        cards[index]["usage"] = {"outOfBandMiB": mib}
        inventory.write_text(yaml.safe_dump({"cards": cards}))
        os.utime(inventory, ns=(time.time_ns(), time.time_ns() + 1_000_000))

    return SamplingRig(lambda: make_backend(config, "n1"), use, leak)


SAMPLING_RIGS: dict[BackendKind, Callable[[pytest.MonkeyPatch, Path], SamplingRig]] = {
    BackendKind.NVML: nvml_sampling,
    BackendKind.FAKE: fake_sampling,
}


def test_every_backend_has_a_sampling_rig() -> None:
    assert set(SAMPLING_RIGS) == set(BACKENDS)


@pytest.fixture(params=list(BACKENDS), ids=lambda kind: kind.value)
def sampling(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> SamplingRig:
    return SAMPLING_RIGS[request.param](monkeypatch, tmp_path)


def test_idle_cards_are_sampled_idle(sampling: SamplingRig) -> None:
    backend = sampling.build()
    backend.discover()
    samples = backend.sample(())
    assert [(s.uuid, s.used_mib, s.sm_percent, s.processes) for s in samples] == [
        (row.uuid, 0, 0, ()) for row in TABLE]


def test_a_process_is_reported_on_its_card_with_memory_and_sm(sampling: SamplingRig) -> None:
    backend = sampling.build()
    backend.discover()
    holders = sampling.use(2, 3000, 40)
    by_uuid = {s.uuid: s for s in backend.sample(holders)}
    t4 = by_uuid[TABLE[2].uuid]
    assert [(p.memory_mib, p.sm_percent) for p in t4.processes] == [(3000, 40)]
    # A process is either a real pid the agent maps by cgroup, or names its owner.
    assert all(p.pid > 0 or p.owner is not None for p in t4.processes)
    assert t4.used_mib == 3000 and t4.sm_percent == 40
    assert by_uuid[TABLE[0].uuid].processes == () and by_uuid[TABLE[0].uuid].used_mib == 0


def test_memory_no_process_accounts_for_is_used_beyond_the_processes(
        sampling: SamplingRig) -> None:
    backend = sampling.build()
    backend.discover()
    holders = sampling.use(0, 1000, 10)
    sampling.leak(0, 2048)
    card = backend.sample(holders)[0]
    assert card.used_mib == 1000 + 2048
    assert sum(p.memory_mib for p in card.processes) == 1000


# -- isolation providers: what a container gets, per provider, for every backend ---------------
#
# Each provider of `sharing.mode` (accounting, mps, mps with the agent's per-card daemons,
# hami-core) gives a container a share, a whole card and a MIG instance; the grant (env,
# mounts, device files) is the contract, identical for every backend.

SHARE = (0, 300, 4096)  # card index, milli, MiB


class Provider(enum.Enum):
    ACCOUNTING = "accounting"
    MPS = "mps"
    MPS_PER_CARD = "mps-per-card"
    HAMI_CORE = "hami-core"


def provider_config(provider: Provider, tmp_path: Path) -> AgentConfig:
    sharing: dict[str, Any] = {"mode": provider.value}
    if provider is Provider.MPS_PER_CARD:
        sharing = {"mode": "mps", "mps": {"daemon": {}}}
    if provider is Provider.HAMI_CORE:
        library = tmp_path / "vgpu" / "libvgpu.so"
        library.parent.mkdir(exist_ok=True)
        library.write_bytes(b"\x7fELF stand-in")
        sharing["hamiCore"] = {"library": str(library),
                               "cacheDirectory": str(tmp_path / "vgpu" / "containers"),
                               "lockDirectory": str(tmp_path / "vgpulock")}
    return AgentConfig.model_validate({"sharing": sharing})


def provider_grant(rig: Rig, config: AgentConfig, share: CardShare) -> Grant:
    backend = rig.build()
    physical = backend.discover()
    cards = {lc.index: lc for lc in logical_cards(physical, False)}
    files = DeviceFiles({c.uuid: backend.device_nodes(c) for c in physical},
                        backend.control_nodes())
    return build_grant([share], cards, config, backend.visible_devices_env, files,
                       backend.isolation(config.sharing))


def expected_devices(rig: Rig, index: int) -> list[str]:
    return [*rig.control_nodes, *rig.device_nodes[index]]


def test_every_sharing_mode_is_a_provider_of_the_contract() -> None:
    """The isolation cases below run per Provider: a sharing mode added to the config without
    one here would escape them (a memory-only share's compute, a multi-card share...)."""
    assert {m.value for m in SharingMode} <= {p.value for p in Provider}


@pytest.fixture(params=list(Provider), ids=lambda p: p.value)
def provider(request: pytest.FixtureRequest) -> Provider:
    return Provider(request.param)


def test_a_share_gets_the_providers_limits(rig: Rig, provider: Provider,
                                           tmp_path: Path) -> None:
    index, milli, mib = SHARE
    config = provider_config(provider, tmp_path)
    g = provider_grant(rig, config, CardShare(index, TABLE[index].uuid, milli, mib))
    assert g.envs[rig.visible_devices_env] == TABLE[index].uuid
    assert [d.host_path for d in g.devices] == expected_devices(rig, index)
    assert g.envs["EGPU_CORE_PERCENT"] == "30" and g.envs["EGPU_MEMORY_MIB"] == "4096"
    limits = {k: v for k, v in g.envs.items() if k.startswith(("CUDA_", "LD_PRELOAD"))}
    mounts = [(m.container_path, m.host_path, m.read_only) for m in g.mounts]
    if provider is Provider.ACCOUNTING:
        assert g.envs["EGPU_ISOLATION"] == "accounting-only"
        assert limits == {} and mounts == []
    elif provider is Provider.MPS:
        assert g.envs["EGPU_ISOLATION"] == "mps"
        assert limits == rig.mps_envs
        assert mounts == [("/tmp/nvidia-mps", "/tmp/nvidia-mps", False)]
    elif provider is Provider.MPS_PER_CARD:
        # The same environment; the mount is the card's own daemon's pipe directory.
        assert g.envs["EGPU_ISOLATION"] == "mps"
        assert limits == rig.mps_envs
        # With the daemons' shared memory as its /dev/shm (as NVIDIA's plugin does).
        assert mounts == [("/tmp/nvidia-mps", f"/tmp/nvidia-mps/{TABLE[index].uuid}", False),
                          ("/dev/shm", "/run/egpu/mps/shm", False)]
    else:
        hami = config.sharing.hamiCore
        assert g.envs["EGPU_ISOLATION"] == "hami-core"
        assert limits == {"CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_SM_LIMIT": "30",
                          "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/vgpu.cache",
                          "LD_PRELOAD": "/usr/local/vgpu/libvgpu.so"}
        library, cache, lock = mounts
        assert library == ("/usr/local/vgpu/libvgpu.so", hami.library, True)
        assert cache[0] == "/usr/local/vgpu/cache" and not cache[2]
        assert Path(cache[1]).parent == Path(hami.cacheDirectory) and Path(cache[1]).is_dir()
        # HAMi-core takes its locks in /tmp/vgpulock: the node's lock directory, shared.
        assert lock == ("/tmp/vgpulock", hami.lockDirectory, False)
    assert g.annotations["elasticgpu.io/isolation"] == g.envs["EGPU_ISOLATION"]


def test_a_whole_card_gets_the_card(rig: Rig, provider: Provider, tmp_path: Path) -> None:
    row = TABLE[0]
    g = provider_grant(rig, provider_config(provider, tmp_path),
                       CardShare(0, row.uuid, 1000, row.memory_mib))
    assert g.envs[rig.visible_devices_env] == row.uuid
    assert [d.host_path for d in g.devices] == expected_devices(rig, 0)
    assert "EGPU_CORE_PERCENT" not in g.envs
    if provider in (Provider.MPS, Provider.MPS_PER_CARD):
        # An MPS client all the same (the card's daemon may run): all of the card.
        assert g.envs["EGPU_ISOLATION"] == "mps"
        assert g.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
        assert g.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={row.memory_mib}M"
    else:
        assert g.envs["EGPU_ISOLATION"] == "exclusive"
        assert not any(k.startswith(("CUDA_", "LD_PRELOAD")) for k in g.envs)
        assert g.mounts == ()


def test_a_mig_instance_is_held_by_the_hardware(rig: Rig, provider: Provider,
                                               tmp_path: Path) -> None:
    if not rig.has(Capability.MIG):
        return
    row, mig = TABLE[1], TABLE[1].mig[0]
    g = provider_grant(rig, provider_config(provider, tmp_path),
                       CardShare(1, row.uuid, 0, 0, mig.profile, mig.uuid))
    assert g.envs[rig.visible_devices_env] == mig.uuid
    assert g.envs["EGPU_ISOLATION"] == "mig"
    assert not any(k.startswith(("CUDA_", "LD_PRELOAD")) for k in g.envs)
    assert g.mounts == ()
    assert [d.host_path for d in g.devices] == expected_devices(rig, 1)


def test_a_multi_card_share_gets_each_cards_limits(rig: Rig, provider: Provider,
                                                   tmp_path: Path) -> None:
    """Issue 40: a share of 30% and 4096 MiB on each of two cards (cards 0 and 2, plain) is
    held per card: per-device memory (and, for HAMi-core, compute) limits in the order the
    container sees the devices; per-card MPS daemons cannot hold a client on two cards."""
    shares = [CardShare(i, TABLE[i].uuid, 300, 4096) for i in (0, 2)]
    config = provider_config(provider, tmp_path)
    backend = rig.build()
    physical = backend.discover()
    cards = {lc.index: lc for lc in logical_cards(physical, False)}
    files = DeviceFiles({c.uuid: backend.device_nodes(c) for c in physical},
                        backend.control_nodes())
    isolation = backend.isolation(config.sharing)
    if provider is Provider.MPS_PER_CARD:
        with pytest.raises(GrantError, match="cannot be held by per-card MPS daemons"):
            build_grant(shares, cards, config, backend.visible_devices_env, files, isolation)
        return
    g = build_grant(shares, cards, config, backend.visible_devices_env, files, isolation)
    assert g.envs[rig.visible_devices_env] == f"{TABLE[0].uuid},{TABLE[2].uuid}"
    assert g.envs["EGPU_CARDS"] == "0,2"
    assert g.envs["EGPU_CORE_PERCENT"] == "30,30" and g.envs["EGPU_MEMORY_MIB"] == "4096,4096"
    if provider is Provider.MPS:
        assert g.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert g.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
    elif provider is Provider.HAMI_CORE:
        limits = {k: v for k, v in g.envs.items() if k.startswith("CUDA_DEVICE_")}
        assert limits == {"CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
                          "CUDA_DEVICE_MEMORY_LIMIT_1": "4096m",
                          "CUDA_DEVICE_SM_LIMIT": "30", "CUDA_DEVICE_SM_LIMIT_0": "30",
                          "CUDA_DEVICE_SM_LIMIT_1": "30",
                          "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/cache/vgpu.cache"}
    else:
        assert g.envs["EGPU_ISOLATION"] == "accounting-only"


def test_a_memory_only_share_is_limited_in_memory_only(rig: Rig, provider: Provider,
                                                       tmp_path: Path) -> None:
    """Issue 40: a share that asked memory alone bills the 1 % compute device the webhook gave
    it (`milli` 10), but the container asked no compute (`limit_compute=False`,
    `core.request.limits_compute`): every provider that limits compute leaves it unlimited
    (HAMi-core's 0, as HAMi for a missing gpucores; MPS's 100 %, as for a whole card) and
    still limits its memory; on one card and on two (a multi-card memory-only share)."""
    config = provider_config(provider, tmp_path)
    backend = rig.build()
    physical = backend.discover()
    cards = {lc.index: lc for lc in logical_cards(physical, False)}
    files = DeviceFiles({c.uuid: backend.device_nodes(c) for c in physical},
                        backend.control_nodes())
    isolation = backend.isolation(config.sharing)
    for indexes in ((0,), (0, 2)):
        shares = [CardShare(i, TABLE[i].uuid, 10, 3000) for i in indexes]
        if provider is Provider.MPS_PER_CARD and len(indexes) > 1:
            continue  # one MPS client, one daemon: refused, as any multi-card share
        g = build_grant(shares, cards, config, backend.visible_devices_env, files, isolation,
                        limit_compute=False)
        n = len(indexes)
        assert g.envs["EGPU_CORE_PERCENT"] == ",".join(["1"] * n)  # what the ledger bills
        assert g.envs["EGPU_MEMORY_MIB"] == ",".join(["3000"] * n)
        if provider in (Provider.MPS, Provider.MPS_PER_CARD):
            assert g.envs["EGPU_ISOLATION"] == "mps"
            assert g.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
            assert g.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == ",".join(
                f"{i}=3000M" for i in range(n))
        elif provider is Provider.HAMI_CORE:
            assert g.envs["EGPU_ISOLATION"] == "hami-core"
            limits = {k: v for k, v in g.envs.items()
                      if k.startswith(("CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"))}
            assert limits == {"CUDA_DEVICE_SM_LIMIT": "0",
                              **{f"CUDA_DEVICE_MEMORY_LIMIT_{i}": "3000m" for i in range(n)},
                              **({f"CUDA_DEVICE_SM_LIMIT_{i}": "0" for i in range(n)}
                                 if n > 1 else {})}
        else:
            assert g.envs["EGPU_ISOLATION"] == "accounting-only"
            assert not any(k.startswith("CUDA_") for k in g.envs)
    # the same share asking its 1 % (limit_compute, the default) is held to it
    share = CardShare(0, TABLE[0].uuid, 10, 3000)
    g = build_grant([share], cards, config, backend.visible_devices_env, files, isolation)
    if provider in (Provider.MPS, Provider.MPS_PER_CARD):
        assert g.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"
    elif provider is Provider.HAMI_CORE:
        assert g.envs["CUDA_DEVICE_SM_LIMIT"] == "1"


def test_hami_core_without_its_library_refuses(rig: Rig, tmp_path: Path) -> None:
    config = provider_config(Provider.HAMI_CORE, tmp_path)
    Path(config.sharing.hamiCore.library).unlink()
    index, milli, mib = SHARE
    with pytest.raises(GrantError, match=r"libvgpu\.so is not on this node.*refusing"):
        provider_grant(rig, config, CardShare(index, TABLE[index].uuid, milli, mib))


def test_hami_core_preloaded_through_ld_so_preload(rig: Rig, tmp_path: Path) -> None:
    config = provider_config(Provider.HAMI_CORE, tmp_path)
    hami = config.sharing.hamiCore.model_copy(update={"preload": Preload.LD_SO_PRELOAD})
    config = config.model_copy(update={"sharing": config.sharing.model_copy(
        update={"hamiCore": hami})})
    index, milli, mib = SHARE
    g = provider_grant(rig, config, CardShare(index, TABLE[index].uuid, milli, mib))
    assert "LD_PRELOAD" not in g.envs
    preload = [m for m in g.mounts if m.container_path == "/etc/ld.so.preload"]
    assert len(preload) == 1 and preload[0].read_only
    assert Path(preload[0].host_path).read_text() == "/usr/local/vgpu/libvgpu.so\n"
