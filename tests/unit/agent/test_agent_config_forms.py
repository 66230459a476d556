"""NVIDIA's device plugin config and the IX plugin's ConfigMap, read unchanged.

The samples below are the plugins' published ones as their users write them (the IX plugin's
ix-device-plugin.yaml ConfigMap data and README, NVIDIA's README and chart values); each must
map onto the one `AgentConfig`, and the agent's own device functions must then advertise what
the plugin's documentation promises (IX: 2 GPUs with replicas 4 advertise 8).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import (
    AgentConfig,
    MigStrategy,
    load_config,
    parse_config,
)
from elastic_gpu.agent.config_forms import Form, FormError, detect_form
from elastic_gpu.agent.devices import build_plans, logical_cards, node_capacity
from elastic_gpu.api.config.loader import ConfigError
from elastic_gpu.api.config.strict_yaml import read_yaml
from elastic_gpu.core.nodefit import NODE_CORE

# The IX plugin's ConfigMap (ix-device-plugin.yaml): its `data`, the file under `ix-config`.
IX_CONFIGMAP_DATA = '''
ix-config: |-
    version: "4.2.0"
    flags:
      splitboard: false
'''
# The IX README's ConfigMap file of the later releases: no version, the resource named.
IX_README_FILE = '''
resourceName: "iluvatar.com/gpu"
flags:
  splitboard: false
  usevolcano: false
  reset_gpu: false
'''
# The IX README's time-slicing example ("a node with 2 GPUs ... would advertise 8").
IX_TIME_SLICING_FILE = '''
flags:
    splitboard: false
sharing:
    timeSlicing:
        replicas: 4
'''
# NVIDIA's README: the plugin's config file.
NVIDIA_FILE = '''
version: v1
flags:
  migStrategy: "none"
  failOnInitError: true
  nvidiaDriverRoot: "/"
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: "envvar"
    deviceIDStrategy: "uuid"
'''
# NVIDIA's README: time-slicing.
NVIDIA_TIME_SLICING_FILE = '''
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 10
'''
# NVIDIA's chart values: one entry of config.map.
NVIDIA_MIG_MIXED_FILE = '''
version: v1
flags:
  migStrategy: mixed
'''

BOARDS = {"boards": [{"id": "bi0", "model": "BI-V150", "chips": 2, "memoryMiB": 32768},
                     {"id": "bi1", "model": "BI-V150", "chips": 2, "memoryMiB": 32768}]}
TWO_CARDS = {"cards": [{"model": "BI-V100", "memoryMiB": 32768},
                       {"model": "BI-V100", "memoryMiB": 32768}]}


def config_of(text: str) -> AgentConfig:
    return parse_config(read_yaml(text), "cm.yaml")


def capacity(inventory: dict[str, Any], config: AgentConfig) -> dict[str, str]:
    cards = logical_cards(FakeBackend.from_dict(inventory, "n1").discover(), config.splitBoard)
    return node_capacity(cards, config, build_plans(cards, config))[0]


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        config_of(text)
    return str(err.value)


def test_ix_configmap_data_verbatim() -> None:
    config = config_of(IX_CONFIGMAP_DATA)
    assert config.resources.gpu == "iluvatar.com/gpu"
    assert not config.splitBoard and config.timeSlicing.replicas == 1
    # A 2-chip board unsplit is one device, as the IX plugin advertises it.
    assert capacity(BOARDS, config)["iluvatar.com/gpu"] == "2"


def test_ix_readme_file_without_version() -> None:
    config = config_of(IX_README_FILE)
    assert config.resources.gpu == "iluvatar.com/gpu" and not config.splitBoard
    assert config == config_of('version: "4.3.0"\n' + IX_README_FILE)


def test_ix_time_slicing_advertises_what_its_readme_promises() -> None:
    config = config_of(IX_TIME_SLICING_FILE)
    assert config.resources.gpu == "iluvatar.com/gpu" and config.timeSlicing.replicas == 4
    assert capacity(TWO_CARDS, config)["iluvatar.com/gpu"] == "8"
    # exactly what the IX plugin advertises: no share resources beside the replicas (a share
    # pod on a time-sliced board would take its replica slots); beside them only the
    # node-level count kube-scheduler reads, 100 per replica (each replica pod counts 100)
    assert set(capacity(TWO_CARDS, config)) == {"iluvatar.com/gpu", NODE_CORE}
    assert capacity(TWO_CARDS, config)[NODE_CORE] == "800"
    # Two 2-chip boards: 2 cards x 4 unsplit, 4 chips x 4 split.
    assert capacity(BOARDS, config)["iluvatar.com/gpu"] == "8"
    split = config_of(IX_TIME_SLICING_FILE.replace("splitboard: false", "splitboard: true"))
    assert split.splitBoard and capacity(BOARDS, split)["iluvatar.com/gpu"] == "16"


def test_ix_replicas_zero_is_its_unset_value() -> None:
    config = config_of('version: "4.4.0"\nsharing: {timeSlicing: {replicas: 0}}\n')
    assert config.timeSlicing.replicas == 1
    assert capacity(TWO_CARDS, config)["iluvatar.com/gpu"] == "2"


def test_ix_resource_name_is_the_advertised_resource() -> None:
    config = config_of('version: "4.3.0"\nresourceName: elasticgpu.io/gpu\n')
    assert config.resources.gpu == "elasticgpu.io/gpu"


def test_nvidia_file_sample() -> None:
    config = config_of(NVIDIA_FILE)
    assert config.resources.gpu == "nvidia.com/gpu"
    assert config.migStrategy is MigStrategy.NONE
    assert config.deviceSpecs is False  # passDeviceSpecs: false
    # Without passDeviceSpecs NVIDIA's default (false) holds too; the agent's own is true.
    assert config_of("version: v1\n").deviceSpecs is False
    assert config_of("version: v1\nflags: {plugin: {passDeviceSpecs: true}}\n").deviceSpecs
    assert AgentConfig().deviceSpecs


def test_nvidia_time_slicing_sample() -> None:
    config = config_of(NVIDIA_TIME_SLICING_FILE)
    assert config.timeSlicing.replicas == 10 and not config.timeSlicing.renameByDefault
    assert capacity(TWO_CARDS, config)["nvidia.com/gpu"] == "20"
    # NVIDIA's plugin sells no shares; the node-level count is 100 per replica
    assert set(capacity(TWO_CARDS, config)) == {"nvidia.com/gpu", NODE_CORE}
    assert capacity(TWO_CARDS, config)[NODE_CORE] == "2000"
    renamed = config_of(NVIDIA_TIME_SLICING_FILE.replace(
        "  timeSlicing:\n", "  timeSlicing:\n    renameByDefault: true\n"
        "    failRequestsGreaterThanOne: true\n"))
    assert renamed.timeSlicing.renameByDefault and renamed.timeSlicing.failRequestsGreaterThanOne
    assert capacity(TWO_CARDS, renamed)["nvidia.com/gpu.shared"] == "20"
    # An explicit rename to <name>.shared, and a bare name NVIDIA prefixes with nvidia.com/.
    explicit = config_of("version: v1\nsharing: {timeSlicing: {resources: "
                         "[{name: gpu, replicas: 2, rename: gpu.shared, devices: all}]}}\n")
    assert explicit.time_sliced_resource == "nvidia.com/gpu.shared"
    assert explicit.timeSlicing.replicas == 2


def test_nvidia_mig_mixed_from_chart_values() -> None:
    config = config_of(NVIDIA_MIG_MIXED_FILE)
    assert config.migStrategy is MigStrategy.MIXED
    inventory = {"cards": [{"model": "A100-SXM4-80GB", "memoryMiB": 81920,
                            "mig": [{"profile": "3g.40gb", "uuid": "MIG-a", "start": 0},
                                    {"profile": "3g.40gb", "uuid": "MIG-b", "start": 4}]},
                           {"model": "A100-SXM4-80GB", "memoryMiB": 81920}]}
    cap = capacity(inventory, config)
    assert cap["nvidia.com/mig-3g.40gb"] == "2" and cap["nvidia.com/gpu"] == "1"


def test_ignored_nvidia_fields_are_accepted_and_change_nothing() -> None:
    full = config_of(
        "version: v1\nflags:\n  migStrategy: none\n  failOnInitError: false\n"
        "  restartOnDeviceUnhealthy: true\n  nvidiaDriverRoot: /run/nvidia/driver\n"
        "  nvidiaDevRoot: /\n  gdsEnabled: false\n  mofedEnabled: false\n"
        "  plugin: {deviceListStrategy: [envvar], cdiAnnotationPrefix: cdi.k8s.io/,\n"
        "           nvidiaCTKPath: /usr/bin/nvidia-ctk, containerDriverRoot: /driver-root}\n"
        "  gfd: {oneshot: false, noTimestamp: false, sleepInterval: 60s,\n"
        "        outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd}\n"
        "resources: {gpus: []}\nsharing: {mps: {}}\nimex: {channelIDs: [], required: false}\n")
    assert full == config_of("version: v1\n")


def test_both_forms_through_load_config(tmp_path: Path) -> None:
    ix = tmp_path / "ix-config"  # the IX ConfigMap mounted as a directory of files
    ix.write_text('version: "4.2.0"\nflags:\n  splitboard: true\n'
                  "sharing:\n  timeSlicing:\n    replicas: 4\n")
    config = load_config(ix)
    assert config.splitBoard and config.timeSlicing.replicas == 4
    nvidia = tmp_path / "config.yaml"
    nvidia.write_text(NVIDIA_TIME_SLICING_FILE)
    assert load_config(nvidia).timeSlicing.replicas == 10


@pytest.mark.parametrize("text", [
    "{}", "timeSlicing: {replicas: 2}\n", "sharing: {mode: mps}\n", "migStrategy: mixed\n",
    "resources: {gpu: iluvatar.com/gpu}\nsplitBoard: true\n",
])
def test_own_form_is_detected_and_unchanged(text: str) -> None:
    data = read_yaml(text)
    assert detect_form(data) is Form.ELASTIC_GPU
    assert parse_config(data) == AgentConfig.model_validate(data)


@pytest.mark.parametrize(("text", "form"), [
    (NVIDIA_FILE, Form.NVIDIA), (NVIDIA_TIME_SLICING_FILE, Form.NVIDIA),
    ("flags: {migStrategy: single}\n", Form.NVIDIA),
    ("sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n", Form.NVIDIA),
    (IX_README_FILE, Form.IX), (IX_TIME_SLICING_FILE, Form.IX),
    ('version: "4.2.0"\n', Form.IX), ("sharing: {timeSlicing: {replicas: 2}}\n", Form.IX),
])
def test_form_detection(text: str, form: Form) -> None:
    assert detect_form(read_yaml(text)) is form


@pytest.mark.parametrize("version", ["v2", "v1beta1", "4.1.0", "4.5.0", "", "V1"])
def test_unknown_versions_are_refused(version: str) -> None:
    text = refusal(f'version: "{version}"\nflags: {{migStrategy: none}}\n')
    assert "cm.yaml" in text and f"version: got {version!r} (a string): unknown version" in text
    assert "'v1' (NVIDIA device plugin)" in text and "'4.4.0'" in text


def test_version_must_be_a_string() -> None:
    text = refusal("version: 4.2\nflags: {splitboard: true}\n")
    assert "version: got 4.2 (a number): must be a string (quote it)" in text


def test_a_file_that_could_be_either_plugins_is_refused() -> None:
    text = refusal("flags: {migStrategy: none, splitboard: true}\n")
    assert "cannot tell whether this is NVIDIA's or the IX" in text and "version: v1" in text
    assert "cannot tell" in refusal("flags: {}\n")


@pytest.mark.parametrize(("text", "field", "words"), [
    # IX
    ('version: "4.2.0"\nflags: {splitboard: "true"}\n', "flags.splitboard",
     "got 'true' (a string): must be true or false"),
    ('version: "4.2.0"\nflags: {splitboard: yes}\n', "flags.splitboard", "must be true or false"),
    ('version: "4.2.0"\nsharing: {timeSlicing: {replicas: "4"}}\n',
     "sharing.timeSlicing.replicas", "must be a whole number written without quotes"),
    ('version: "4.2.0"\nsharing: {timeSlicing: {replicas: 65}}\n',
     "sharing.timeSlicing.replicas", "got 65 (an integer): must be 0-64"),
    ('version: "4.2.0"\nresourceName: nvidia.com/gpu-core\n', "resourceName",
     "whole-card resource"),
    ('version: "4.2.0"\nresourceName: 7\n', "resourceName", "must be a string"),
    ('version: "4.2.0"\nflags: {usevolcano: true}\n', "flags.usevolcano", "must be false"),
    ('version: "4.2.0"\nflags: {reset_gpu: true}\n', "flags.reset_gpu", "never resets"),
    ('version: "4.2.0"\nflags: {splitBoard: true}\n', "flags.splitBoard",
     "is not a key of the IX device plugin form"),
    ('version: "4.2.0"\nsharing: {mps: {replicas: 2}}\n', "sharing.mps.replicas",
     "MPS replicas are not supported"),
    ('version: "4.2.0"\ntimeSlicing: {replicas: 2}\n', "timeSlicing",
     "Elastic GPU form's keys cannot be mixed in"),
    ('version: "4.2.0"\nflags: [splitboard]\n', "flags", "must be a mapping of settings"),
    # NVIDIA
    ("version: v1\nflags: {migStrategy: Mixed}\n", "flags.migStrategy",
     "must be none, single or mixed"),
    ("version: v1\nflags: {failOnInitError: 1}\n", "flags.failOnInitError",
     "got 1 (an integer): must be true or false"),
    ("version: v1\nflags: {nvidiaDriverRoot: 1}\n", "flags.nvidiaDriverRoot", "must be a string"),
    ("version: v1\nflags: {nvidiaDriverRoot: run/nvidia}\n", "flags.nvidiaDriverRoot",
     "must be an absolute path"),
    ("version: v1\nflags: {plugin: {containerDriverRoot: ''}}\n",
     "flags.plugin.containerDriverRoot", "must be an absolute path"),
    ("version: v1\nflags: {gdsEnabled: true}\n", "flags.gdsEnabled", "GPUDirect Storage"),
    ("version: v1\nflags: {plugin: {deviceListStrategy: cdi-cri}}\n",
     "flags.plugin.deviceListStrategy", "must be envvar"),
    ("version: v1\nflags: {plugin: {deviceIDStrategy: index}}\n",
     "flags.plugin.deviceIDStrategy", "must be uuid"),
    ("version: v1\nflags: {plugin: {passDeviceSpecs: on}}\n", "flags.plugin.passDeviceSpecs",
     "must be true or false"),
    ("version: v1\nresources: {gpus: [{pattern: '*', name: gpu}]}\n", "resources.gpus",
     "renaming resources by pattern is not supported"),
    ("version: v1\nsharing: {timeSlicing: {}}\n", "sharing.timeSlicing.resources",
     "must be a non-empty list"),
    ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}\n",
     "sharing.timeSlicing.resources[0].replicas", "is required"),
    ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}\n",
     "sharing.timeSlicing.resources[0].replicas", "must be 2-64"),
    ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: '4'}]}}",
     "sharing.timeSlicing.resources[0].replicas", "without quotes"),
    ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.10gb, "
     "replicas: 2}]}}\n", "sharing.timeSlicing.resources[0].name", "must be nvidia.com/gpu"),
    ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, "
     "devices: [0, 1]}]}}\n", "sharing.timeSlicing.resources[0].devices", "must be all"),
    ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, "
     "rename: nvidia.com/shared-gpu}]}}\n", "sharing.timeSlicing.resources[0].rename",
     "must be nvidia.com/gpu.shared"),
    ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}, "
     "{name: gpu, replicas: 3}]}}\n", "sharing.timeSlicing.resources[1].name", "listed twice"),
    ("version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n",
     "sharing.mps", "NVIDIA's MPS replicas are not supported"),
    ("version: v1\nimex: {channelIDs: [0]}\n", "imex.channelIDs", "IMEX channels"),
    ("version: v1\nbackend: fake\n", "backend", "is not a key of the NVIDIA device plugin form"),
])
def test_wrong_fields_are_refused_naming_field_value_and_rule(text: str, field: str,
                                                              words: str) -> None:
    message = refusal(text)
    line = next((ln for ln in message.splitlines() if ln.strip().startswith(f"{field}:")), None)
    assert line is not None, message
    assert words in line, message
    assert "cm.yaml: invalid agent config (" in message and "plugin form)" in message


def test_every_problem_is_reported_at_once() -> None:
    message = refusal("version: v1\nflags: {migStrategy: Mixed, gdsEnabled: true}\n"
                      "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, "
                      "replicas: '4'}]}}\n")
    assert len(message.splitlines()) == 4


def test_configmap_data_with_one_file_is_unwrapped_only_for_file_keys() -> None:
    # A key of the agent's own form holding a string is that setting, not a file.
    assert parse_config({"migStrategy": "mixed"}).migStrategy is MigStrategy.MIXED
    assert parse_config({"config.yaml": NVIDIA_TIME_SLICING_FILE}).timeSlicing.replicas == 10
    with pytest.raises(ConfigError) as err:
        parse_config({"ix-config": "flags: [unclosed\n"}, "cm.yaml")
    assert "cm.yaml: ix-config: not valid YAML" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_config({"ix-config": 'version: "4.2.0"\nflags: {splitboard: 1}\n'}, "cm.yaml")
    assert "cm.yaml: ix-config: invalid agent config" in str(err.value)
    assert "flags.splitboard: got 1 (an integer)" in str(err.value)
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        parse_config({"ix-config": "- a\n"})
    # Several files (NVIDIA's per-node config map) are not guessed between.
    with pytest.raises(ConfigError):
        parse_config({"default": "version: v1\n", "mig": "version: v1\n"})


def test_form_error_carries_the_form() -> None:
    with pytest.raises(FormError) as err:
        detect_form({"version": "v9"})
    assert err.value.form is None
    assert "unknown version" in str(err.value)


def test_sandbox_cluster_file_takes_the_ix_configmap_data_verbatim() -> None:
    from elastic_gpu.devcluster.nodes import node_capacity as fake_node_capacity
    from elastic_gpu.devcluster.nodes import parse_cluster

    data = read_yaml("nodeGroups:\n- name: ix\n  count: 1\n  gpus: 2\n  model: BI-V100\n"
                     "  memoryMiB: 32768\n  agentConfig:\n    ix-config: |-\n"
                     '      version: "4.2.0"\n      flags:\n        splitboard: false\n'
                     "      sharing:\n        timeSlicing:\n          replicas: 4\n")
    (group,) = parse_cluster(data, "c.yaml")
    (node,) = group.inventories()
    assert fake_node_capacity(node, group.agent_config)["iluvatar.com/gpu"] == "8"
    bad = read_yaml("nodeGroups:\n- name: ix\n  count: 1\n  gpus: 2\n"
                    '  agentConfig: {version: "9.9.9"}\n')
    with pytest.raises(ValueError, match=r"(?s)nodeGroups\[0\] \(ix\)\.agentConfig.*unknown version"):
        parse_cluster(bad, "c.yaml")


def test_agent_cli_refuses_an_unknown_version_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v2\nflags: {migStrategy: none}\n")
    result = subprocess.run([sys.executable, "-m", "elastic_gpu.cli.main", "agent", "--node",
                             "n1", "--config", str(config), "--no-api"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "version: got 'v2' (a string): unknown version" in result.stderr
