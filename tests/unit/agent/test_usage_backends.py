"""Each backend's sampling beyond the conformance contract: NVML's calls and their gaps, the
fake usage model's real processes, hostile annotations, the usage config block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egpu_testing.scripted_nvml import SimNvml, two_gpus
from elastic_gpu.agent.backends.base import Holder, ProcessSample
from elastic_gpu.agent.backends.fake import (
    USAGE_ANNOTATION,
    FakeBackend,
    container_usage,
    parse_inventory,
)
from elastic_gpu.agent.backends.nvml import NvmlBackend
from elastic_gpu.agent.config import DriftPolicy, parse_config
from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.core.usage import ContainerRef

REF = ContainerRef("ml", "train", "main")
CID = "4f3b1c2d" * 8
UID = "7e5b3b9c-1f7a-4c3e-9a55-2f0d8b6c1a42"


def test_nvml_lists_processes_with_memory_and_their_newest_sm_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].processes = [(100, 4000), (200, None)]  # 200: the driver cannot say
    gpus[0].leaked_mib = 512
    gpus[0].util = 70
    gpus[0].process_util = [(100, 30, 5), (100, 60, 9)]
    gpus[1].process_util = None  # MIG mode: no per-process samples
    gpus[1].processes = [(300, 1000)]
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    first = backend.sample()
    assert first[0].used_mib == 4512 and first[0].sm_percent == 70
    assert first[0].processes == (ProcessSample(100, 4000, 60), ProcessSample(200, 0, None))
    assert first[1].processes == (ProcessSample(300, 1000, None),)
    # The next sample asks only for samples after the newest seen: none, so no SM figures.
    assert backend.sample()[0].processes[0].sm_percent is None


def test_nvml_leaves_out_a_card_it_cannot_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    SimNvml(monkeypatch, gpus)
    backend = NvmlBackend()
    backend.discover()
    gpus[1].lost = True
    assert [s.uuid for s in backend.sample()] == ["GPU-aaaa"]


def test_the_fake_reports_a_containers_real_processes(tmp_path: Path) -> None:
    for pid in (41, 40):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(
            f"0::/kubepods/besteffort/pod{UID}/{CID}\n")
    inventory = parse_inventory({"cards": [{"model": "A100", "memoryMiB": 40960}]}, "test")
    backend = FakeBackend(inventory, "n1", proc=tmp_path)
    annotations = {USAGE_ANNOTATION: json.dumps({"main": {"memoryMiB": 3000, "smPercent": 20}})}
    (sample,) = backend.sample([Holder("GPU-fake-n1-0", REF, annotations, (CID,))])
    assert sample.processes == (ProcessSample(40, 3000, 20), ProcessSample(41, 0, None))
    # Not running here (a kwok node): one process with no pid, naming its owner.
    (sample,) = backend.sample([Holder("GPU-fake-n1-0", REF, annotations, ("0" * 64,))])
    assert sample.processes == (ProcessSample(0, 3000, 20, REF),)


@pytest.mark.parametrize("raw", [
    "not json", "[]", '{"main": 5}', '{"main": {"memoryMiB": -1}}',
    '{"main": {"memoryMiB": true}}', '{"main": {"smPercent": 101}}',
    '{"main": {"memoryMiB": 1e3}}', "x" * 70000])
def test_a_malformed_usage_annotation_is_ignored(raw: str) -> None:
    assert container_usage({USAGE_ANNOTATION: raw}, "main") is None


def test_the_usage_annotation_names_containers() -> None:
    raw = json.dumps({"main": {"memoryMiB": 10}})
    assert container_usage({USAGE_ANNOTATION: raw}, "main") == (10, 0)
    assert container_usage({USAGE_ANNOTATION: raw}, "side") is None
    assert container_usage({}, "main") is None


def test_usage_config_defaults_and_strictness() -> None:
    usage = parse_config({}).usage
    assert (usage.enabled, usage.sampleSeconds, usage.writeSeconds,
            usage.outOfBandThresholdMiB, usage.drift.policy) == (
        True, 5.0, 30.0, 1024, DriftPolicy.REPORT)
    assert parse_config({"usage": {"drift": {"policy": "evict"}}}).usage.drift.policy \
        is DriftPolicy.EVICT
    for bad in ({"writeSeconds": 0.1}, {"drift": {"policy": "kill"}}, {"sampleSecond": 5},
                {"outOfBandThresholdMiB": "1Gi"}, {"drift": {"eventSeconds": 0}}):
        with pytest.raises(ConfigError):
            parse_config({"usage": bad})


def test_a_kwok_nodes_card_usage_comes_from_its_annotation() -> None:
    from elastic_gpu.agent.usage.fake_sync import card_usage_model

    def node(raw: str) -> dict[str, object]:
        return {"metadata": {"name": "k", "annotations": {USAGE_ANNOTATION: raw}}}

    model = card_usage_model(node('{"1": {"outOfBandMiB": 2048, "smPercent": 30}}'))
    assert {i: (u.outOfBandMiB, u.smPercent) for i, u in model.items()} == {1: (2048, 30)}
    assert card_usage_model({"metadata": {}}) == {}
    for bad in ("[1]", '{"x": {}}', '{"0": {"outOfBandMiB": -1}}', '{"0": {"bogus": 1}}',
                "{", "1" * 70000):
        assert card_usage_model(node(bad)) == {}
