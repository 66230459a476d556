"""The agent's configuration file: one YAML document, ConfigMap-friendly, validated strictly.

In the spirit of NVIDIA's device plugin config (`sharing.timeSlicing`, `migStrategy`) and the
IX (Iluvatar) plugin's (`splitBoard`): every key is camelCase, unknown keys are errors (a typo
must not silently fall back to a default), and a broken file is reported with the path of
the offending field, the value found and the rule it breaks, e.g.
``splitBoard: got 'yes' (a string): must be true or false``.

Types are strict: a bool is only `true`/`false`, an integer only an unquoted whole number, a
number only an unquoted number, a string only a string; enums take exactly their documented
values and paths are strings. The YAML reader follows YAML 1.2's core schema for scalars, so
`yes`/`on`/`no`, `010` (octal in YAML 1.1), `1_000` or `1:30` (sexagesimal) are strings and
then refused by the field they are given to, never silently converted; a key given twice is
an error too. The full reference is docs/agent.md.

NVIDIA's device plugin config (`version: v1`) and the IX plugin's ConfigMap (`version:
"4.3.0"`) are accepted unchanged beside this form and mapped onto `AgentConfig` by
`config_forms` (also when given as a ConfigMap's `data`, the file under one key).
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from elastic_gpu.agent.config_forms import Form, FormError, describe, detect_form, to_agent_form
from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_MEMORY,
    MIG_RESOURCE_PATTERN,
    Measure,
    lookup,
)

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins/"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the field."""


class BackendKind(enum.Enum):
    NVML = "nvml"
    FAKE = "fake"


class MigStrategy(enum.Enum):
    #: MIG instances are not advertised; cards are advertised whole.
    NONE = "none"
    #: Every card is carved the same way; each instance is advertised as the plain GPU resource.
    SINGLE = "single"
    #: Each instance is advertised as nvidia.com/mig-<g>g.<m>gb; non-MIG cards stay whole.
    MIXED = "mixed"


class SharingMode(enum.Enum):
    #: Shares are only counted by the scheduler; nothing stops a container from using more.
    ACCOUNTING = "accounting"
    #: Shares are enforced by the CUDA MPS server's per-client limits.
    MPS = "mps"


def _text_only(value: Any) -> Any:
    """Enums and paths are written as YAML strings; pydantic's lax mode would also take other
    types for some of them (bytes for a path), strict mode none at all (it wants the Python
    object). Strings, or the object itself when built in Python, are the only inputs."""
    if isinstance(value, str | Path | enum.Enum):
        return value
    raise ValueError("must be a string")


# Enums from their string values, paths from strings: lax parsing after a string-only check.
Backend = Annotated[BackendKind, Field(strict=False), BeforeValidator(_text_only)]
Mig = Annotated[MigStrategy, Field(strict=False), BeforeValidator(_text_only)]
Sharing = Annotated[SharingMode, Field(strict=False), BeforeValidator(_text_only)]
YamlPath = Annotated[Path, Field(strict=False), BeforeValidator(_text_only)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True,
                              allow_inf_nan=False)


class ResourcesConfig(_Strict):
    """Which extended resources the agent advertises."""

    #: Whole cards (or chips of a split board, or time-sliced replicas of cards).
    gpu: str = "nvidia.com/gpu"
    #: Compute shares: 100 devices per card (one per percent). Aliases such as
    #: tencent.com/vcuda-core or nano-gpu/gpu-percent may be listed too.
    share: list[str] = Field(default_factory=lambda: [GPU_CORE])
    #: Memory: one device per unit of the resource (MiB for elasticgpu.io/gpu-memory) when
    #: that is at most `maxDevicesPerCard`; larger counts are advertised in node status only.
    memory: list[str] = Field(default_factory=lambda: [GPU_MEMORY])
    maxDevicesPerCard: int = Field(default=1024, ge=1, le=65536)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str) -> str:
        spec = lookup(value)
        if spec is None or spec.measure is not Measure.CARDS:
            raise ValueError(f"{value!r} is not a whole-card resource of the resource table "
                             "(e.g. nvidia.com/gpu, iluvatar.com/gpu, elasticgpu.io/gpu)")
        return value

    @field_validator("share")
    @classmethod
    def _share(cls, values: list[str]) -> list[str]:
        return _check_measure(values, Measure.COMPUTE, "a compute-share resource")

    @field_validator("memory")
    @classmethod
    def _memory(cls, values: list[str]) -> list[str]:
        return _check_measure(values, Measure.MEMORY, "a card-memory resource")


def _check_measure(values: list[str], measure: Measure, what: str) -> list[str]:
    for value in values:
        spec = lookup(value)
        if spec is None or spec.measure is not measure:
            raise ValueError(f"{value!r} is not {what} of the resource table")
    if len(set(values)) != len(values):
        raise ValueError(f"{values} lists a resource twice")
    return values


class TimeSlicingConfig(_Strict):
    """Advertise each whole card `replicas` times (oversubscription, no isolation)."""

    replicas: int = Field(default=1, ge=1, le=64)
    #: True: replicas are advertised as `<gpu>.shared` so that pods must opt in (NVIDIA's
    #: renameByDefault); False: under the plain GPU resource name.
    renameByDefault: bool = False
    #: A pod may not take two replicas of one card (NVIDIA's failRequestsGreaterThanOne).
    failRequestsGreaterThanOne: bool = False


class MpsConfig(_Strict):
    #: Host directory of the MPS control daemon's pipes, mounted into containers.
    pipeDirectory: str = "/tmp/nvidia-mps"


class SharingConfig(_Strict):
    mode: Sharing = SharingMode.ACCOUNTING
    mps: MpsConfig = Field(default_factory=MpsConfig)


class HealthConfig(_Strict):
    enabled: bool = True
    #: How long one wait for driver events lasts; also the fake backend's poll period.
    pollSeconds: float = Field(default=1.0, gt=0, le=60)
    #: XIDs that are the application's fault and never mark a card unhealthy.
    ignoredXids: list[int] = Field(default_factory=lambda: [13, 31, 43, 45, 68, 109])
    #: An unhealthy card is probed again this long after its last critical event and is
    #: healthy again if the driver answers; 0 disables recovery.
    recoverAfterSeconds: float = Field(default=60.0, ge=0)


class FakeConfig(_Strict):
    #: YAML inventory of the fake backend (see docs/agent.md); re-read when it changes, so
    #: editing its `health:` list injects health changes.
    inventory: YamlPath


class AgentConfig(_Strict):
    backend: Backend = BackendKind.NVML
    fake: FakeConfig | None = None
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    #: Multi-chip boards: False advertises a board as one device, True each chip.
    splitBoard: bool = False
    timeSlicing: TimeSlicingConfig = Field(default_factory=TimeSlicingConfig)
    migStrategy: Mig = MigStrategy.NONE
    sharing: SharingConfig = Field(default_factory=SharingConfig)
    deviceSpecs: bool = True
    devicePluginDir: YamlPath = Path(DEFAULT_PLUGIN_DIR)
    healthCheck: HealthConfig = Field(default_factory=HealthConfig)
    #: How often pods' assignments are summed into the inventory's allocation columns.
    syncSeconds: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _fake_needs_inventory(self) -> AgentConfig:
        if self.backend is BackendKind.FAKE and self.fake is None:
            raise ValueError("backend 'fake' needs fake.inventory (the fake inventory file)")
        for name in self.resources.share:
            if MIG_RESOURCE_PATTERN.match(name):
                raise ValueError(f"{name} is a MIG resource; MIG resources come from migStrategy")
        return self

    @property
    def time_sliced_resource(self) -> str:
        """The name whole cards are advertised under (renamed when time-sliced by default)."""
        if self.timeSlicing.replicas > 1 and self.timeSlicing.renameByDefault:
            return f"{self.resources.gpu}.shared"
        return self.resources.gpu


#: Clearer rules for pydantic's type errors (the rest keep pydantic's wording, which already
#: states the rule: "Input should be greater than or equal to 1", "'none', 'single' or ...").
_RULES = {
    "bool_type": "must be true or false",
    "int_type": "must be a whole number written without quotes",
    "float_type": "must be a number written without quotes",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "model_type": "must be a mapping of settings",
    "dict_type": "must be a mapping of settings",
    "extra_forbidden": "is not a known key (check the spelling; Extra inputs are not permitted)",
    "missing": "is required",
}

_describe = describe


def _format(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        where = where.removeprefix(".") or "(top level)"
        rule = _RULES.get(item["type"], str(item["msg"]).removeprefix("Value error, "))
        if item["type"] == "missing" or not item["loc"]:
            lines.append(f"  {where}: {rule}")
        else:
            lines.append(f"  {where}: got {_describe(item['input'])}: {rule}")
    return "\n".join(lines)


class _StrictYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars and no duplicate keys.

    PyYAML implements YAML 1.1, where `yes`, `on`, `no`, `off` are booleans, `010` is octal 8,
    `1_000` is 1000 and `1:30` is 90. A config reader must not guess like that: here only
    true/false (any case of YAML 1.2's spellings) are booleans, only plain decimal integers
    are integers, and everything else stays a string for the field's own check to refuse."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
_StrictYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"))
_StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:0|-?[1-9][0-9]*)$"), list("-0123456789"))
_StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?$"), list("-0123456789"))


def read_yaml(text: str) -> Any:
    """One YAML document with the strict scalar rules of `_StrictYamlLoader`."""
    return yaml.load(text, Loader=_StrictYamlLoader)


def _configmap_file(data: dict[Any, Any]) -> tuple[str, str] | None:
    """(key, text) when `data` is a ConfigMap's `data`: one key, a file name that is no key of
    any form (e.g. the IX plugin's `ix-config`), holding the config file as YAML text."""
    if len(data) != 1:
        return None
    ((key, value),) = data.items()
    if (not isinstance(key, str) or not isinstance(value, str) or key in AgentConfig.model_fields
            or key in ("version", "resourceName", "flags", "imex")):
        return None
    return key, value


def parse_config(data: Any, source: str = "config") -> AgentConfig:
    """An `AgentConfig` from a parsed YAML document in any accepted form: the agent's own,
    NVIDIA's device plugin config (`version: v1`) or the IX plugin's (`version: "4.3.0"`),
    each also as a ConfigMap's `data` holding the file under one key (see config_forms)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the agent config must be a YAML mapping, got "
                          f"{type(data).__name__}")
    inner = _configmap_file(data)
    if inner is not None:
        key, text = inner
        source = f"{source}: {key}"
        try:
            data = read_yaml(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{source}: not valid YAML: {err}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the agent config must be a YAML mapping, got "
                              f"{type(data).__name__}")
    try:
        form = detect_form(data)
        mapped = to_agent_form(form, data)
    except FormError as err:
        what = f" ({err.form.value})" if err.form is not None else ""
        raise ConfigError(f"{source}: invalid agent config{what}:\n{err}") from None
    try:
        return AgentConfig.model_validate(mapped)
    except ValidationError as err:
        what = "" if form is Form.ELASTIC_GPU else f" (mapped from the {form.value})"
        raise ConfigError(f"{source}: invalid agent config{what}:\n{_format(err)}") from None


def load_config(path: Path) -> AgentConfig:
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the agent config: {err.strerror}") from None
    try:
        data = read_yaml(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    config = parse_config(data, str(path))
    if config.fake is not None and not config.fake.inventory.is_absolute():
        # Relative inventory paths are relative to the config file (a mounted ConfigMap).
        fake = config.fake.model_copy(update={"inventory": path.parent / config.fake.inventory})
        config = config.model_copy(update={"fake": fake})
    return config
