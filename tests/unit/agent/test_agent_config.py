from __future__ import annotations

from pathlib import Path

import pytest

from elastic_gpu.agent.config import (
    AgentConfig,
    BackendKind,
    ConfigError,
    MigStrategy,
    SharingMode,
    load_config,
    parse_config,
)


def test_defaults_are_nvidia_with_accounting_only_sharing() -> None:
    config = AgentConfig()
    assert config.backend is BackendKind.NVML
    assert config.resources.gpu == "nvidia.com/gpu"
    assert config.resources.share == ["elasticgpu.io/gpu-core"]
    assert config.sharing.mode is SharingMode.ACCOUNTING
    assert config.migStrategy is MigStrategy.NONE
    assert str(config.devicePluginDir) == "/var/lib/kubelet/device-plugins"


def test_full_config_file_with_relative_fake_inventory(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text("cards: []\n")
    path = tmp_path / "agent.yaml"
    path.write_text(
        "backend: fake\nfake: {inventory: inv.yaml}\nsplitBoard: true\n"
        "timeSlicing: {replicas: 4, renameByDefault: true}\nmigStrategy: mixed\n"
        "sharing: {mode: mps}\nresources: {gpu: iluvatar.com/gpu}\n")
    config = load_config(path)
    assert config.fake is not None and config.fake.inventory == tmp_path / "inv.yaml"
    assert config.splitBoard and config.timeSlicing.replicas == 4
    assert config.time_sliced_resource == "iluvatar.com/gpu.shared"
    assert config.migStrategy is MigStrategy.MIXED and config.sharing.mode is SharingMode.MPS


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"timeSlicing": {"replicas": 0}}, "timeSlicing.replicas", "greater than or equal to 1"),
    ({"timeSlicng": {"replicas": 2}}, "timeSlicng", "Extra inputs are not permitted"),
    ({"migStrategy": "some"}, "migStrategy", "'none', 'single' or 'mixed'"),
    ({"resources": {"gpu": "elasticgpu.io/gpu-core"}}, "resources.gpu", "not a whole-card"),
    ({"resources": {"share": ["nvidia.com/gpu"]}}, "resources.share", "compute-share"),
    ({"backend": "fake"}, "(top level)", "fake.inventory"),
    ({"healthCheck": {"pollSeconds": -1}}, "healthCheck.pollSeconds", "greater than 0"),
])
def test_broken_config_names_the_field(data: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "cm.yaml")
    text = str(err.value)
    assert "cm.yaml" in text and field in text and words in text


def test_not_a_mapping_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        parse_config(["a"], "x")
    bad = tmp_path / "bad.yaml"
    bad.write_text("backend: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_the_deployed_configmap_is_a_valid_config() -> None:
    import yaml

    root = Path(__file__).resolve().parents[3]
    docs = list(yaml.safe_load_all((root / "deploy/agent/agent.yaml").read_text()))
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config = parse_config(yaml.safe_load(configmap["data"]["agent.yaml"]), "configmap")
    assert config.backend is BackendKind.NVML and config.sharing.mode is SharingMode.ACCOUNTING
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    command = daemonset["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["egpu", "agent"] and "--config" in command
