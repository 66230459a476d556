"""The agent's configuration file: one YAML document, ConfigMap-friendly, validated strictly.

In the spirit of NVIDIA's device plugin config (`sharing.timeSlicing`, `migStrategy`) and the
IX (Iluvatar) plugin's (`splitBoard`): every key is camelCase, unknown keys are errors (a typo
must not silently fall back to a default), and a broken file is reported with the path of
the offending field, the value found and the rule it breaks, e.g.
``splitBoard: got 'yes' (a string): must be true or false``.

Types are strict: a bool is only `true`/`false`, an integer only an unquoted whole number, a
number only an unquoted number, a string only a string; enums take exactly their documented
values and paths are absolute. Every number has a range (minimum and maximum): a period the
agent waits on is neither so short that it floods the API server nor so long that the
thread waiting on it dies (`threading.Event.wait` overflows). A section that does not belong
to the chosen backend is refused, and the fake inventory must be an existing file. The file is
read by the one settings loader (`elastic_gpu.api.config.loader`, `strict_yaml`): YAML 1.2
scalars (`yes`, `010`, `1:30` are strings, then refused by the field they are given to), no anchors or
aliases, bounded nesting and numbers, string keys, no key twice, UTF-8. The full reference is
docs/agent.md.

NVIDIA's device plugin config (`version: v1`) and the IX plugin's ConfigMap (`version:
"4.3.0"`) are accepted unchanged beside this form and mapped onto `AgentConfig` by
`config_forms` (also when given as a ConfigMap's `data`, the file under one key).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from elastic_gpu.agent.config_forms import Form, FormError, detect_form, to_agent_form
from elastic_gpu.api.config.loader import (
    HEADER_KEYS,
    ConfigError,
    Problem,
    describe,
    header_problems,
    merged_problems,
    new_spellings,
    read_file,
    read_text,
    without_header,
)
from elastic_gpu.api.config.merge import (
    Override,
    Rename,
    with_overrides,
)
from elastic_gpu.core.resources import (
    GPU_CORE,
    GPU_MEMORY,
    GPU_TFLOPS,
    MIG_RESOURCE_PATTERN,
    Measure,
    lookup,
)

#: The kind of the agent config's optional header (`apiVersion: elasticgpu.io/v1alpha1`).
KIND = "AgentConfig"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins/"
#: Where the kubelet serves its PodResources API (the DaemonSet mounts the directory read-only).
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: DRA mode: the plugin's own directory (its service socket and checkpoint), kubelet's plugin
#: watcher directory (the registration socket), and the container runtime's CDI directory.
DEFAULT_DRA_PLUGIN_DIR = "/var/lib/kubelet/plugins/gpu.elasticgpu.io"
DEFAULT_DRA_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_CDI_DIR = "/var/run/cdi"
#: Keys renamed to the spelling the other keys use (a directory's key ends in `Directory`):
#: the old spelling is still read, with a warning naming the new key (docs/config.md).
RENAMED_KEYS = (
    Rename("devicePluginDir", "devicePluginDirectory"),
    Rename("dra.pluginDir", "dra.pluginDirectory"),
    Rename("dra.registryDir", "dra.registryDirectory"),
    Rename("dra.cdiDir", "dra.cdiDirectory"),
)
#: The longest path a unix socket may have (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
#: The file names of the DRA plugin's sockets (`agent.dra.kubelet_plugin`).
DRA_SOCKET_NAMES = {"pluginDirectory": "dra.sock",
                    "registryDirectory": "gpu.elasticgpu.io-reg.sock"}


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
    #: Shares are enforced by HAMi-core (libvgpu.so), an operator-installed CUDA API
    #: interception library preloaded into each container.
    HAMI_CORE = "hami-core"


def _text_only(value: Any) -> Any:
    """Enums and paths are written as YAML strings; pydantic's lax mode would also take other
    types for some of them (bytes for a path), strict mode none at all (it wants the Python
    object). Strings, or the object itself when built in Python, are the only inputs."""
    if isinstance(value, str | Path | enum.Enum):
        return value
    raise ValueError("must be a string")


def _absolute(value: Any) -> Any:
    """A host path the agent opens: absolute, so that it does not depend on the directory the
    agent was started in (an empty string would be the current directory)."""
    value = _text_only(value)
    text = str(value)
    if not text or not text.startswith("/") or "\0" in text:
        raise ValueError("must be an absolute path (starting with /)")
    return value


def _named_file(value: Any) -> Any:
    value = _text_only(value)
    if not str(value):
        raise ValueError("must be a file path (absolute, or relative to this config file)")
    return value


# Enums from their string values, paths from strings: lax parsing after a string-only check.
Backend = Annotated[BackendKind, Field(strict=False), BeforeValidator(_text_only)]
Mig = Annotated[MigStrategy, Field(strict=False), BeforeValidator(_text_only)]
Sharing = Annotated[SharingMode, Field(strict=False), BeforeValidator(_text_only)]
AbsolutePath = Annotated[Path, Field(strict=False), BeforeValidator(_absolute)]
AbsolutePathText = Annotated[str, BeforeValidator(_absolute)]
#: The fake inventory: relative to the config file it is written in (`load_config`).
FilePath = Annotated[Path, Field(strict=False), BeforeValidator(_named_file)]

#: NVML's XIDs are small positive numbers (the documented ones are below 200).
Xid = Annotated[int, Field(ge=1, le=65535)]


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
    #: Compute shares asked in TFLOPS: one device per TFLOPS of a card whose model the TFLOPS
    #: table knows (`core.tflops`); a card of another model advertises none. Always a device
    #: plugin, whatever `maxDevicesPerCard` (the table's largest card is under 1,000): kubelet
    #: calls Allocate only for device-plugin resources, and Allocate gives the card.
    tflops: list[str] = Field(default_factory=lambda: [GPU_TFLOPS])
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

    @field_validator("tflops")
    @classmethod
    def _tflops(cls, values: list[str]) -> list[str]:
        return _check_measure(values, Measure.TFLOPS, "a TFLOPS resource")


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


class MpsDaemonConfig(_Strict):
    """The agent runs one MPS control daemon per card (`sharing.mps.daemon`); without this
    section the operator runs one daemon for the node (the pipe directory as given)."""

    #: The MPS control program (`<binary> -d` starts a daemon, `echo quit | <binary>` stops it).
    binary: AbsolutePathText = "/usr/bin/nvidia-cuda-mps-control"
    #: Per card `<logDirectory>/<card uuid>` holds its control.log and server.log.
    logDirectory: AbsolutePathText = "/var/log/nvidia-mps"
    #: How often each daemon is checked (its pid file and process).
    checkSeconds: float = Field(default=2.0, ge=0.05, le=300)
    #: A daemon that dies is started again at once, then after this delay, doubled with every
    #: death in a row up to `restartMaxSeconds`.
    restartInitialSeconds: float = Field(default=1.0, ge=0.01, le=3600)
    restartMaxSeconds: float = Field(default=60.0, ge=0.01, le=3600)
    #: How long a start may take to leave its pid file before it counts as failed.
    startTimeoutSeconds: float = Field(default=10.0, ge=0.1, le=300)
    #: How often each running daemon is asked over its control pipe (`echo
    #: get_default_active_thread_percentage | <binary>`, NVIDIA's device plugin's health
    #: check): a daemon whose process runs but does not answer is hung. 0: never asked (the
    #: pid file and process only). A start counts as done only once the daemon answers.
    probeSeconds: float = Field(default=10.0, ge=0, le=3600)
    #: How long the answer may take; beyond it the daemon is hung, killed and restarted.
    probeTimeoutSeconds: float = Field(default=5.0, ge=0.1, le=60)
    #: Host directory (a tmpfs) shared as /dev/shm by the daemons (the agent's own /dev/shm:
    #: the chart mounts it there) and every MPS client container, as NVIDIA's device plugin
    #: shares /run/nvidia/mps/shm: MPS clients and server exchange shared memory.
    shmDirectory: AbsolutePathText = "/run/egpu/mps/shm"

    @model_validator(mode="after")
    def _ordered(self) -> MpsDaemonConfig:
        if self.restartMaxSeconds < self.restartInitialSeconds:
            raise ValueError("restartMaxSeconds must be at least restartInitialSeconds")
        return self


class MpsConfig(_Strict):
    #: Host directory of the MPS control daemon's pipes, mounted into containers. With
    #: `daemon`, each card's daemon has `<pipeDirectory>/<card uuid>`, which a container of
    #: that card gets mounted at `pipeDirectory`.
    pipeDirectory: AbsolutePathText = "/tmp/nvidia-mps"
    #: Set: the agent runs and supervises the daemons (one per card).
    daemon: MpsDaemonConfig | None = None


class Preload(enum.Enum):
    #: LD_PRELOAD=<library in the container> in the container's environment.
    ENV = "env"
    #: /etc/ld.so.preload mounted read-only (as HAMi's device plugin does): also binaries
    #: that clear their environment load the library.
    LD_SO_PRELOAD = "ldSoPreload"


PreloadMode = Annotated[Preload, Field(strict=False), BeforeValidator(_text_only)]


class HamiCoreConfig(_Strict):
    """HAMi-core (`sharing.mode: hami-core`): the operator installs libvgpu.so on the node."""

    #: The library on the host (where HAMi installs it); mounted read-only.
    library: AbsolutePathText = "/usr/local/vgpu/libvgpu.so"
    #: How the container loads it.
    preload: PreloadMode = Preload.ENV
    #: Host directory under which each container gets its own directory for HAMi-core's
    #: shared usage cache (CUDA_DEVICE_MEMORY_SHARED_CACHE).
    cacheDirectory: AbsolutePathText = "/usr/local/vgpu/containers"
    #: Host directory of HAMi-core's cross-container lock files, mounted into every container
    #: at /tmp/vgpulock (where the library takes them).
    lockDirectory: AbsolutePathText = "/tmp/vgpulock"


class SharingConfig(_Strict):
    mode: Sharing = SharingMode.ACCOUNTING
    mps: MpsConfig = Field(default_factory=MpsConfig)
    hamiCore: HamiCoreConfig = Field(default_factory=HamiCoreConfig)

    @model_validator(mode="after")
    def _sections_of_the_mode(self) -> SharingConfig:
        # A section for another mode is a mistake to say, not a setting to ignore.
        if self.mps.daemon is not None and self.mode is not SharingMode.MPS:
            raise ValueError(f"mps.daemon belongs to mode mps, not {self.mode.value}")
        if "hamiCore" in self.model_fields_set and self.mode is not SharingMode.HAMI_CORE:
            raise ValueError(f"hamiCore belongs to mode hami-core, not {self.mode.value}")
        return self


class HealthConfig(_Strict):
    enabled: bool = True
    #: How long one wait for driver events lasts; also the fake backend's poll period. Not
    #: below 0.05 s: a shorter wait is a busy loop.
    pollSeconds: float = Field(default=1.0, ge=0.05, le=60)
    #: XIDs that are the application's fault and never mark a card unhealthy.
    ignoredXids: list[Xid] = Field(default_factory=lambda: [13, 31, 43, 45, 68, 109],
                                   max_length=256)
    #: An unhealthy card is probed again this long after its last critical event and is
    #: healthy again if the driver answers; 0 disables recovery. At most a day.
    recoverAfterSeconds: float = Field(default=60.0, ge=0, le=86400)


class FakeConfig(_Strict):
    #: YAML inventory of the fake backend (see docs/agent.md); re-read when it changes, so
    #: editing its `health:` list injects health changes.
    inventory: FilePath
    #: Where the fake cards' MIG layouts persist (an absolute path under the agent's state
    #: directory, e.g. the DRA plugin's; written atomically after each MIG step, read at
    #: start): a fake agent killed mid-change restarts with the layout it left, as a real
    #: card keeps its own. Unset (the default): the layout lives in the process only.
    migState: AbsolutePath | None = None


# -- observed usage (issue 28): sampling, status.usage writes, drift --------------------------


class DriftPolicy(enum.Enum):
    #: A container above its memory share gets a Warning Event and the over-share metric.
    REPORT = "report"
    #: As report, and its pod is deleted (with an Event saying why).
    EVICT = "evict"


Drift = Annotated[DriftPolicy, Field(strict=False), BeforeValidator(_text_only)]


class DriftConfig(_Strict):
    policy: Drift = DriftPolicy.REPORT
    #: Under `evict`, also delete pods no controller owns (nothing recreates them); off by
    #: default: such a pod is only reported.
    evictUnownedPods: bool = False
    #: At most one Event per container and card per this many seconds.
    eventSeconds: float = Field(default=300.0, ge=1, le=86400)


class UsageConfig(_Strict):
    """Observed usage (docs/agent.md "Observed usage")."""

    enabled: bool = True
    #: How often the cards are sampled (metrics and drift follow each sample).
    sampleSeconds: float = Field(default=5.0, ge=0.5, le=3600)
    #: At most one round of `status.usage` writes per node per this many seconds.
    writeSeconds: float = Field(default=30.0, ge=1, le=3600)
    #: A card whose out-of-band memory moved this much since its last write is written at once.
    outOfBandThresholdMiB: int = Field(default=1024, ge=1, le=1 << 30)
    #: A figure that moved less than its step since the last write is not written (noise).
    memoryQuantumMiB: int = Field(default=256, ge=1, le=65536)
    percentQuantum: int = Field(default=10, ge=1, le=100)
    #: An unchanged card is written again after this long (0: never), so observedAt stays
    #: a witness that the agent still samples it.
    refreshSeconds: float = Field(default=300.0, ge=0, le=86400)
    #: The kubelet's PodResources socket, read every sample for which container kubelet gave
    #: which of this agent's devices (docs/agent.md); absent (no kubelet: kwok, `--no-api`
    #: tests), the sample goes on without it.
    podResourcesSocket: AbsolutePathText = DEFAULT_POD_RESOURCES_SOCKET
    drift: DriftConfig = Field(default_factory=DriftConfig)


class MetricsConfig(_Strict):
    """Where the agent serves Prometheus `/metrics` (`elasticgpu_agent_*`, docs/metrics.md;
    `egpu agent --metrics-host`, `--metrics-port`)."""

    host: str = "0.0.0.0"
    #: 0: no metrics
    port: int = Field(default=0, ge=0, le=65535)


class DraConfig(_Strict):
    """DRA mode (docs/dra.md, "The kubelet plugin"): the node serves GPUs as the DRA driver
    gpu.elasticgpu.io (ResourceSlices and the kubelet's DRA plugin) instead of device plugins
    and GPUDevice objects. Its Node must carry the label elasticgpu.io/gpu-mode=dra."""

    enabled: bool = False
    pluginDirectory: AbsolutePath = Path(DEFAULT_DRA_PLUGIN_DIR)
    registryDirectory: AbsolutePath = Path(DEFAULT_DRA_REGISTRY_DIR)
    cdiDirectory: AbsolutePath = Path(DEFAULT_CDI_DIR)

    @field_validator("pluginDirectory", "registryDirectory")
    @classmethod
    def _socket_fits(cls, value: Path, info: ValidationInfo) -> Path:
        socket = value / DRA_SOCKET_NAMES[str(info.field_name)]
        if len(str(socket)) > MAX_SOCKET_PATH:
            raise ValueError(f"its socket {socket} would be {len(str(socket))} bytes long; a "
                             f"unix socket path has at most {MAX_SOCKET_PATH}")
        return value


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
    devicePluginDirectory: AbsolutePath = Path(DEFAULT_PLUGIN_DIR)
    healthCheck: HealthConfig = Field(default_factory=HealthConfig)
    #: How often pods' assignments are summed into the inventory's allocation columns (one
    #: GPUDevice status write per card): at least 1 s, so the agent does not flood the API
    #: server, at most an hour, so the heartbeat stays meaningful.
    syncSeconds: float = Field(default=10.0, ge=1, le=3600)
    usage: UsageConfig = Field(default_factory=UsageConfig)
    dra: DraConfig = Field(default_factory=DraConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @field_validator("fake")
    @classmethod
    def _fake_only_for_fake(cls, value: FakeConfig | None, info: ValidationInfo
                            ) -> FakeConfig | None:
        backend = info.data.get("backend")
        if value is not None and backend is not BackendKind.FAKE:
            shown = backend.value if isinstance(backend, BackendKind) else backend
            raise ValueError(f"belongs to backend fake, not {shown}: remove it or set "
                             "backend: fake")
        return value

    @model_validator(mode="after")
    def _fake_needs_inventory(self) -> AgentConfig:
        if self.backend is BackendKind.FAKE and self.fake is None:
            raise ValueError("backend 'fake' needs fake.inventory (the fake inventory file)")
        for name in self.resources.share:
            if MIG_RESOURCE_PATTERN.match(name):
                raise ValueError(f"{name} is a MIG resource; MIG resources come from migStrategy")
        if self.dra.enabled and self.timeSlicing.replicas > 1:
            raise ValueError("timeSlicing.replicas belongs to the device-plugin path: with "
                             "dra.enabled a card is shared through the claims' capacity "
                             "requests (docs/dra.md)")
        return self

    @property
    def time_sliced_resource(self) -> str:
        """The name whole cards are advertised under (renamed when time-sliced by default)."""
        if self.timeSlicing.replicas > 1 and self.timeSlicing.renameByDefault:
            return f"{self.resources.gpu}.shared"
        return self.resources.gpu


def _configmap_file(data: dict[Any, Any]) -> tuple[str, str] | None:
    """(key, text) when `data` is a ConfigMap's `data`: one key, a file name that is no key of
    any form (e.g. the IX plugin's `ix-config`), holding the config file as YAML text."""
    if len(data) != 1:
        return None
    ((key, value),) = data.items()
    if (not isinstance(key, str) or not isinstance(value, str) or key in AgentConfig.model_fields
            or key in ("version", "resourceName", "flags", "imex", *HEADER_KEYS)
            or key in {rename.old for rename in RENAMED_KEYS}):
        return None
    return key, value


def parse_config(data: Any, source: str = "config", flags: Iterable[Override] = ()
                 ) -> AgentConfig:
    """An `AgentConfig` from a parsed YAML document in any accepted form: the agent's own,
    NVIDIA's device plugin config (`version: v1`) or the IX plugin's (`version: "4.3.0"`),
    each also as a ConfigMap's `data` holding the file under one key (see config_forms),
    with the flags given on top (`api.config.merge`: a flag given beats the file)."""
    flags = tuple(flags)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _not_a_mapping(source, data)
    inner = _configmap_file(data)
    if inner is not None:
        key, text = inner
        source = f"{source}: {key}"
        data = read_text(text, source)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise _not_a_mapping(source, data)
    problems = header_problems(data, KIND)
    if problems:
        raise ConfigError.invalid(source, "invalid agent config", problems)
    if any(key in data for key in HEADER_KEYS):
        # The header is the Elastic GPU form's; the other plugins' files have `version`.
        data = without_header(data)
        if "version" in data:
            raise ConfigError.invalid(source, "invalid agent config", [Problem(
                "version", describe(data["version"]),
                f"an {KIND} (apiVersion) is the Elastic GPU form, which has no version; leave "
                "out apiVersion and kind for NVIDIA's or the IX plugin's file")])
    try:
        form = detect_form(data)
        used: list[Rename] = []
        if form is Form.ELASTIC_GPU:
            data, used = new_spellings(data, RENAMED_KEYS, source, KIND)
        mapped = to_agent_form(form, data)
    except FormError as err:
        what = f" ({err.form.value})" if err.form is not None else ""
        raise ConfigError.invalid(source, f"invalid agent config{what}", err.problems) from None
    try:
        return AgentConfig.model_validate(with_overrides(mapped, flags))
    except ValidationError as err:
        what = "" if form is Form.ELASTIC_GPU else f" (mapped from the {form.value})"
        raise ConfigError.invalid(source, f"invalid agent config{what}",
                                  merged_problems(err, flags, used)) from None


def _not_a_mapping(source: str, data: Any) -> ConfigError:
    return ConfigError(f"{source}: the agent config must be a YAML mapping, got "
                       f"{type(data).__name__}",
                       [Problem("(top level)", describe(data), "must be a YAML mapping")])


def load_config(path: Path, flags: Iterable[Override] = ()) -> AgentConfig:
    """The agent config in `path` (the one settings loader, any accepted form) with the flags
    given on top, and a relative fake inventory made absolute against the file's directory
    (a mounted ConfigMap) and checked to be an existing regular file."""
    config = parse_config(read_file(path), str(path), flags)
    if config.fake is not None:
        inventory = path.absolute().parent / config.fake.inventory
        if not inventory.is_file():
            why = "is a directory" if inventory.is_dir() else "does not exist"
            raise ConfigError.invalid(str(path), "invalid agent config", [Problem(
                "fake.inventory", describe(str(config.fake.inventory)),
                f"must be an existing file (the fake inventory); {inventory} {why}")])
        fake = config.fake.model_copy(update={"inventory": inventory})
        config = config.model_copy(update={"fake": fake})
    return config
