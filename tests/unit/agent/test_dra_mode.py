"""DRA mode's config section and its pure decisions: the Node label it needs and the only GPU
name it advertises in the Node's status."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.deviceplugin.node import device_plugin_refusal
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.dra.node import dra_capacity, mode_refusal
from elastic_gpu.agent.node_status import status_patch
from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.core.dra.nodemode import GPU_MODE_LABEL
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import accounting_allocatable


def test_defaults_are_off_and_kubelets_directories() -> None:
    dra = parse_config({}).dra
    assert not dra.enabled
    assert dra.pluginDirectory == Path("/var/lib/kubelet/plugins/gpu.elasticgpu.io")
    assert dra.registryDirectory == Path("/var/lib/kubelet/plugins_registry")
    assert dra.cdiDirectory == Path("/var/run/cdi")


@pytest.mark.parametrize(("section", "field", "rule"), [
    ({"enable": True}, "dra.enable", "is not a known key"),
    ({"enabled": "yes"}, "dra.enabled", "must be true or false"),
    ({"cdiDirectory": "cdi"}, "dra.cdiDirectory", "must be an absolute path"),
    ({"registryDirectory": "/" + "r" * 100}, "dra.registryDirectory", "a unix socket path has at most 107"),
])
def test_the_section_is_strict(section: dict[str, object], field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"dra": section})
    assert f"{field}: got" in str(err.value) and rule in str(err.value)


def test_only_a_node_labelled_for_dra_may_run_dra_mode() -> None:
    def node(labels: dict[str, str] | None) -> dict[str, object]:
        return {"metadata": {"name": "n", **({"labels": labels} if labels is not None else {})}}

    assert mode_refusal(node({GPU_MODE_LABEL: "dra"}), "n") is None
    missing = mode_refusal(node(None), "n")
    assert missing is not None and "Node n has no such label" in missing
    assert "elasticgpu.io/gpu-mode: dra" in missing
    other = mode_refusal(node({GPU_MODE_LABEL: "device-plugin"}), "n")
    assert other is not None and "has elasticgpu.io/gpu-mode=device-plugin" in other


def test_a_device_plugin_agent_refuses_a_node_of_the_dra_group() -> None:
    def node(labels: dict[str, str] | None) -> dict[str, object]:
        return {"metadata": {"name": "n", **({"labels": labels} if labels is not None else {})}}

    assert device_plugin_refusal(node(None), "n") is None
    assert device_plugin_refusal(node({GPU_MODE_LABEL: "device-plugin"}), "n") is None
    refused = device_plugin_refusal(node({GPU_MODE_LABEL: "dra"}), "n")
    assert refused is not None and "Node n has elasticgpu.io/gpu-mode=dra" in refused
    assert "twice" in refused


def test_a_dra_node_advertises_only_the_node_level_core_count() -> None:
    backend = FakeBackend.from_dict({"cards": [{"model": "A100", "memoryMiB": 40960}] * 3}, "n")
    cards = {lc.index: lc for lc in logical_cards(backend.discover(), False)}
    assert dra_capacity(cards) == {NODE_CORE: "300"}
    assert dra_capacity({}) == {}


def test_time_slicing_replicas_are_refused_in_dra_mode() -> None:
    with pytest.raises(ConfigError, match=r"timeSlicing\.replicas belongs to the device-plugin"):
        parse_config({"dra": {"enabled": True}, "timeSlicing": {"replicas": 4}})
    assert parse_config({"timeSlicing": {"replicas": 4}}).timeSlicing.replicas == 4


def test_the_quota_accounting_names_are_patched_only_when_missing_or_other() -> None:
    cfg = parse_config({})
    core = {NODE_CORE: "200"}
    want = accounting_allocatable()
    assert set(want) == {"quota.elasticgpu.io/gpu-core", "quota.elasticgpu.io/gpu-memory"}
    have = {"cpu": "8", **core, **want}
    assert status_patch({"capacity": have, "allocatable": have}, core, core, cfg) is None
    assert status_patch({}, core, core, cfg) == {"status": {"capacity": {**core, **want},
                                                            "allocatable": {**core, **want}}}
    canonical = {**core, **dict.fromkeys(want, "1G")}  # as the API server writes 1000000000
    assert status_patch({"capacity": canonical, "allocatable": canonical}, core, core,
                        cfg) is None
    zeroed = {**have, "quota.elasticgpu.io/gpu-core": "0"}  # a restarted kubelet's zero
    assert status_patch({"capacity": have, "allocatable": zeroed}, core, core, cfg) == {
        "status": {"allocatable": {"quota.elasticgpu.io/gpu-core": want[
            "quota.elasticgpu.io/gpu-core"]}}}


def test_a_gpu_name_no_longer_offered_is_removed_and_the_rest_left_alone() -> None:
    """A node turned from the device-plugin group to DRA: its device-plugin names go, its
    CPU and the accounting names stay; a node with no GPU is given no accounting names."""
    cfg = parse_config({})
    core = {NODE_CORE: "200"}
    old = {"cpu": "8", "nvidia.com/gpu": "2", **core, **accounting_allocatable()}
    assert status_patch({"capacity": old, "allocatable": old}, core, core, cfg) == {
        "status": {"capacity": {"nvidia.com/gpu": None}, "allocatable": {"nvidia.com/gpu": None}}}
    assert status_patch({"capacity": {"cpu": "8"}}, {}, {}, cfg) is None
