from __future__ import annotations

import enum
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from elastic_gpu.agent.config import (
    AgentConfig,
    BackendKind,
    MigStrategy,
    SharingMode,
    load_config,
    parse_config,
)
from elastic_gpu.api.config.loader import ConfigError


def test_defaults_are_nvidia_with_accounting_only_sharing() -> None:
    config = AgentConfig()
    assert config.backend is BackendKind.NVML
    assert config.resources.gpu == "nvidia.com/gpu"
    assert config.resources.share == ["elasticgpu.io/gpu-core"]
    assert config.sharing.mode is SharingMode.ACCOUNTING
    assert config.migStrategy is MigStrategy.NONE
    assert str(config.devicePluginDirectory) == "/var/lib/kubelet/device-plugins"


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
    ({"healthCheck": {"pollSeconds": -1}}, "healthCheck.pollSeconds", "greater than or equal to 0.05"),
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


# -- strict types: every field class refuses every wrong type, naming field, value and rule --

def _leaf_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, info in model.model_fields.items():
        annotation = info.annotation
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        section = next((a for a in [annotation, *inner]
                        if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if section is not None:
            yield f"{prefix}{name}", section
            yield from _leaf_fields(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", annotation


def _kind(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "enum"
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2:  # optional (`X | None`): the kind of X
        return _kind(next(a for a in args if a is not type(None)))
    if typing.get_origin(annotation) is typing.Annotated:  # a validated type: its base
        return _kind(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is list:
        item = typing.get_args(annotation)[0]
        if typing.get_origin(item) is typing.Annotated:  # a ranged item: its type
            item = typing.get_args(item)[0]
        return f"list[{item.__name__}]"
    return {bool: "bool", int: "int", float: "float", str: "str", Path: "path"}[annotation]


#: Wrong values for each kind of field, with the words of the rule the message must give.
WRONG: dict[str, list[tuple[Any, str]]] = {
    "bool": [("yes", "must be true or false"), ("true", "must be true or false"),
             (1, "must be true or false"), (0, "must be true or false"),
             (1.0, "must be true or false"), ([], "must be true or false")],
    "int": [("4", "whole number"), (4.0, "whole number"), (True, "whole number"),
            ("0x10", "whole number"), ([4], "whole number")],
    "float": [("1.5", "must be a number"), (True, "must be a number"), ("1", "must be a number"),
              ({"s": 1}, "must be a number"), (float("inf"), "finite number")],
    "str": [(1, "must be a string"), (True, "must be a string"), (1.5, "must be a string"),
            (["a"], "must be a string")],
    "path": [(5, "must be a string"), (False, "must be a string"), (["/x"], "must be a string")],
    "enum": [(1, "must be a string"), (True, "must be a string"), ("NVML", "Input should be"),
             ("", "Input should be")],
    "list[str]": [("elasticgpu.io/gpu-core", "must be a list"), ({"a": 1}, "must be a list"),
                  ([1], "must be a string")],
    "list[int]": [("13", "must be a list"), (["13"], "whole number"), ([True], "whole number")],
    "section": [(4, "must be a mapping"), ("x", "must be a mapping"), ([1], "must be a mapping"),
                (True, "must be a mapping")],
}

CASES = [(path, kind, value, rule)
         for path, annotation in _leaf_fields(AgentConfig)
         for kind in [_kind(annotation)]
         for value, rule in WRONG[kind]]


def _nest(path: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {}
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


def test_every_field_class_is_covered() -> None:
    kinds = {kind for _, kind, _, _ in CASES}
    assert kinds == set(WRONG)
    assert {"splitBoard", "timeSlicing.replicas", "healthCheck.pollSeconds", "backend",
            "devicePluginDirectory", "fake.inventory", "resources.share", "healthCheck.ignoredXids",
            "sharing.mps"} <= {path for path, _, _, _ in CASES}


@pytest.mark.parametrize(("path", "kind", "value", "rule"), CASES,
                         ids=[f"{p}={v!r}" for p, _, v, _ in CASES])
def test_wrong_types_are_refused_naming_field_value_and_rule(
        path: str, kind: str, value: Any, rule: str) -> None:
    data = _nest(path, value)
    if path.startswith("fake"):
        data["backend"] = "fake"
    with pytest.raises(ConfigError) as err:
        parse_config(data, "cm.yaml")
    text = str(err.value)
    line = next((ln for ln in text.splitlines() if ln.strip().startswith(path + ":")
                 or ln.strip().startswith(path + "[")), None)
    assert line is not None, text
    if line.strip().startswith(path + "["):  # a wrong item of a list: the item is named
        value = value[0]
    assert f"got {value!r}"[:40] in line and rule in line, text


@pytest.mark.parametrize(("text", "field", "value"), [
    ("splitBoard: yes\n", "splitBoard", "'yes'"),           # YAML 1.1 boolean
    ("splitBoard: on\n", "splitBoard", "'on'"),
    ("splitBoard: 'true'\n", "splitBoard", "'true'"),       # quoted: a string
    ("deviceSpecs: No\n", "deviceSpecs", "'No'"),
    ('timeSlicing: {replicas: "4"}\n', "timeSlicing.replicas", "'4'"),
    ("timeSlicing: {replicas: 010}\n", "timeSlicing.replicas", "'010'"),   # YAML 1.1 octal
    ("timeSlicing: {replicas: 0x4}\n", "timeSlicing.replicas", "'0x4'"),
    ("timeSlicing: {replicas: 1_0}\n", "timeSlicing.replicas", "'1_0'"),
    ("timeSlicing: {replicas: +4}\n", "timeSlicing.replicas", "'+4'"),
    ("timeSlicing: {replicas: ４}\n", "timeSlicing.replicas", "'４'"),      # full-width digit
    ("syncSeconds: 1:30\n", "syncSeconds", "'1:30'"),                      # YAML 1.1 sexagesimal
    ("healthCheck: {pollSeconds: .inf}\n", "healthCheck.pollSeconds", "'.inf'"),
    ("migStrategy: Mixed\n", "migStrategy", "'Mixed'"),
])
def test_yaml_scalars_are_read_by_yaml_1_2_rules(tmp_path: Path, text: str, field: str,
                                                   value: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message and f"{field}: got {value}" in message


def test_yaml_natural_values_still_work(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("splitBoard: true\ndeviceSpecs: False\ntimeSlicing: {replicas: 4}\n"
                    "healthCheck: {pollSeconds: 1, recoverAfterSeconds: 0.5, ignoredXids: []}\n"
                    "syncSeconds: 2.5e1\nmigStrategy: single\ndevicePluginDirectory: /tmp/dp\n"
                    "sharing: {mode: mps, mps: {pipeDirectory: /run/mps}}\nfake:\n")
    config = load_config(path)
    assert config.splitBoard is True and config.deviceSpecs is False
    assert config.timeSlicing.replicas == 4 and config.healthCheck.pollSeconds == 1.0
    assert config.syncSeconds == 25.0 and config.migStrategy is MigStrategy.SINGLE
    assert config.devicePluginDirectory == Path("/tmp/dp") and config.sharing.mode is SharingMode.MPS


def test_a_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("timeSlicing:\n  replicas: 2\n  replicas: 4\n")
    with pytest.raises(ConfigError, match="key 'replicas' is given twice"):
        load_config(path)


def test_the_deployed_rbac_is_least_privilege() -> None:
    """No CRD rights, no pod writes (kept honest for real by
    tests/integration/agent: test_deploy_rbac_is_enough_for_the_agent_and_no_more)."""
    import yaml

    root = Path(__file__).resolve().parents[3]
    docs = list(yaml.safe_load_all((root / "deploy/agent/agent.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    rights = {(group, res): set(rule["verbs"]) for rule in role["rules"]
              for group in rule["apiGroups"] for res in rule["resources"]}
    assert not [key for key in rights if key[0] == "apiextensions.k8s.io"]
    assert rights[("", "pods")] == {"list", "watch"}
    assert rights[("", "nodes")] == {"get"} and rights[("", "nodes/status")] == {"patch"}
    assert "*" not in {verb for verbs in rights.values() for verb in verbs}
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def _metadata(path: str) -> tuple[Any, list[Any]]:
    """(annotation, constraints) of the AgentConfig field at `path` (a list's items' too)."""
    model: Any = AgentConfig
    *sections, leaf = path.split(".")
    for part in sections:
        annotation = model.model_fields[part].annotation
        model = next(a for a in [annotation, *typing.get_args(annotation)]
                     if isinstance(a, type) and issubclass(a, BaseModel))
    info = model.model_fields[leaf]
    annotation, metadata = info.annotation, list(info.metadata)
    if typing.get_origin(annotation) is list:
        item = typing.get_args(annotation)[0]
        if typing.get_origin(item) is typing.Annotated:
            annotation = typing.get_args(item)[0]
            metadata += [m for extra in typing.get_args(item)[1:]
                         for m in getattr(extra, "metadata", [extra])]
    return annotation, metadata


NUMBERS = [path for path, annotation in _leaf_fields(AgentConfig)
           if _kind(annotation) in ("int", "float", "list[int]")]


def test_every_number_has_a_minimum_and_a_maximum_and_the_charts_schema_says_the_same() -> None:
    """Issue #26 item 13: `syncSeconds: 1e10` or `1e-9` was accepted. Every number of the agent
    config is ranged in the model (the schema the agent reads by), and the chart's values
    schema refuses the same values at `helm install`."""
    root = Path(__file__).resolve().parents[3]
    chart = json.loads((root / "charts/elastic-gpu/values.schema.json").read_text())
    config = chart["properties"]["agent"]["properties"]["config"]
    assert {"syncSeconds", "healthCheck.pollSeconds", "healthCheck.ignoredXids",
            "healthCheck.recoverAfterSeconds", "timeSlicing.replicas"} <= set(NUMBERS)
    for path in NUMBERS:
        _, metadata = _metadata(path)
        low = [m.ge for m in metadata if isinstance(m, annotated_types.Ge)]
        high = [m.le for m in metadata if isinstance(m, annotated_types.Le)]
        assert len(low) == 1 and len(high) == 1, f"{path}: no minimum and maximum ({metadata})"
        node = config
        for part in path.split("."):
            node = node["properties"][part]
        if node.get("type") == "array":
            node = node["items"]
        assert (node["minimum"], node["maximum"]) == (low[0], high[0]), path
    for path in ("devicePluginDirectory", "devicePluginDir", "sharing.mps.pipeDirectory"):
        node = config
        for part in path.split("."):
            node = node["properties"][part]
        assert node["pattern"] == "^/", path
