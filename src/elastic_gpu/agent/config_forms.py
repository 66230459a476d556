"""Other device plugins' config files, read unchanged and mapped onto the agent's own form.

A node moving from NVIDIA's device plugin or the IX (Iluvatar) plugin to this agent keeps its
ConfigMap: `parse_config` accepts three forms and maps each onto the one `AgentConfig`.

- **Elastic GPU** (ours): no `version`; see docs/agent.md.
- **NVIDIA device plugin** (`version: v1`): `flags.migStrategy`, `flags.plugin.*`,
  `sharing.timeSlicing.{renameByDefault, failRequestsGreaterThanOne, resources[]}`; it
  implies `resources.gpu: nvidia.com/gpu`.
- **IX device plugin** (`version: "4.2.0"`, `"4.3.0"` or `"4.4.0"`, the plugin's release):
  `resourceName`, `flags.splitboard`, `sharing.timeSlicing.replicas`; it implies
  `resources.gpu: iluvatar.com/gpu` unless `resourceName` says otherwise.

Both plugins default a missing `version` to their own; so does this module when the keys
tell which plugin a file is for. An unknown version is refused. A field of theirs is either
mapped, accepted and ignored because it changes nothing here (driver roots, GPU feature
discovery's settings, `failOnInitError`), or refused when honouring it would need behaviour the
agent does not have (CDI, MPS replicas, Volcano, replicating a subset of cards); every
refusal names the field, the value and the rule, like the agent's own form. The functions are
pure: `detect_form` and `to_agent_form` take the parsed YAML and return plain data.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from elastic_gpu.api.config.loader import Problem, describe
from elastic_gpu.core.resources import Measure, lookup

NVIDIA_VERSIONS = ("v1",)
#: The IX plugin's config version is its release; these releases share one schema.
IX_VERSIONS = ("4.2.0", "4.3.0", "4.4.0")
NVIDIA_GPU = "nvidia.com/gpu"
IX_GPU = "iluvatar.com/gpu"
MAX_REPLICAS = 64
#: A Go `time.Duration` as written in YAML (GPU feature discovery's sleepInterval).
_GO_DURATION = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?(?:ns|us|µs|ms|s|m|h))+$")


class Form(enum.Enum):
    ELASTIC_GPU = "Elastic GPU agent form"
    NVIDIA = "NVIDIA device plugin form"
    IX = "IX device plugin form"


class FormError(ValueError):
    """A config in one of the forms that cannot be used: one line per problem."""

    def __init__(self, form: Form | None, problems: Iterable[Problem]) -> None:
        self.form = form
        self.problems = tuple(problems)
        super().__init__("\n".join(p.line() for p in self.problems))


_KNOWN_VERSIONS = ("known: 'v1' (NVIDIA device plugin), "
                   + ", ".join(repr(v) for v in IX_VERSIONS)
                   + " (IX device plugin); the Elastic GPU form has no version")

# Keys that mark a file as one plugin's when it has no version.
_NVIDIA_FLAGS = ("migStrategy", "failOnInitError", "restartOnDeviceUnhealthy",
                 "nvidiaDriverRoot", "nvidiaDevRoot", "gdsEnabled", "mofedEnabled", "plugin",
                 "gfd")
_IX_FLAGS = ("splitboard", "usevolcano", "reset_gpu")
_NVIDIA_SLICING = ("resources", "renameByDefault", "failRequestsGreaterThanOne")
#: Top-level keys no Elastic GPU config has.
_FOREIGN_ONLY = ("version", "flags", "resourceName", "imex")


def _sub(data: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    for key in path:
        value = data.get(key)
        if not isinstance(value, Mapping):
            return {}
        data = value
    return data


def detect_form(data: Mapping[str, Any]) -> Form:
    """Which form `data` (one parsed YAML mapping) is written in: its `version`, else keys that
    only one plugin's form has. Raises `FormError` for an unknown version or a file that could
    be either plugin's."""
    if "version" in data:
        version = data["version"]
        if not isinstance(version, str):
            raise FormError(None, [Problem("version", describe(version), "must be a string "
                                           f"(quote it); {_KNOWN_VERSIONS}")])
        if version in NVIDIA_VERSIONS:
            return Form.NVIDIA
        if version in IX_VERSIONS:
            return Form.IX
        raise FormError(None, [Problem("version", describe(version),
                                       f"unknown version; {_KNOWN_VERSIONS}")])
    flags = _sub(data, "flags")
    slicing = _sub(data, "sharing", "timeSlicing")
    nvidia = ("imex" in data or any(k in flags for k in _NVIDIA_FLAGS)
              or any(k in slicing for k in _NVIDIA_SLICING))
    ix = "resourceName" in data or any(k in flags for k in _IX_FLAGS) or "replicas" in slicing
    if nvidia and not ix:
        return Form.NVIDIA
    if ix and not nvidia:
        return Form.IX
    if nvidia or any(k in data for k in _FOREIGN_ONLY):
        raise FormError(None, [Problem("(top level)", None, "cannot tell whether this is "
                                       "NVIDIA's or the IX device plugin's config: add "
                                       f"`version: v1` (NVIDIA) or `version: \"{IX_VERSIONS[-1]}\"` "
                                       "(IX)")])
    return Form.ELASTIC_GPU


class _Reader:
    """Reads one foreign config, collecting every problem (not only the first)."""

    def __init__(self, form: Form) -> None:
        self.form = form
        self.problems: list[Problem] = []

    def refuse(self, where: str, value: Any, rule: str) -> None:
        self.problems.append(Problem(where, describe(value), rule))

    def mapping(self, where: str, value: Any, keys: Iterable[str]) -> Mapping[str, Any]:
        """`value` if it is a mapping with only `keys` (each other key is a problem), else {}."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.refuse(where, value, "must be a mapping of settings")
            return {}
        known = tuple(keys)
        prefix = f"{where}." if where else ""
        for key in value:
            if key not in known:
                self.refuse(f"{prefix}{key}", value[key],
                            f"is not a key of the {self.form.value} (known here: "
                            f"{', '.join(known)}); check the spelling: the Elastic GPU form's "
                            "keys cannot be mixed in")
        return value

    def check(self, where: str, value: Any, ok: Callable[[Any], bool], rule: str) -> bool:
        if ok(value):
            return True
        self.refuse(where, value, rule)
        return False

    def boolean(self, where: str, value: Any) -> bool | None:
        ok = self.check(where, value, lambda v: isinstance(v, bool), "must be true or false")
        return value if ok else None

    def string(self, where: str, value: Any) -> str | None:
        ok = self.check(where, value, lambda v: isinstance(v, str), "must be a string")
        return value if ok else None

    def absolute_path(self, where: str, value: Any) -> str | None:
        """A host path (accepted and ignored or not, it is typed): a string starting with /."""
        if self.string(where, value) is None:
            return None
        ok = self.check(where, value, lambda v: v.startswith("/"),
                        "must be an absolute path (starting with /)")
        return value if ok else None

    def integer(self, where: str, value: Any, low: int, high: int) -> int | None:
        if not isinstance(value, int) or isinstance(value, bool):
            self.refuse(where, value, "must be a whole number written without quotes")
            return None
        if not low <= value <= high:
            self.refuse(where, value, f"must be {low}-{high}")
            return None
        return value

    def false_only(self, where: str, value: Any, why: str) -> None:
        """A switch for behaviour the agent does not have: false (or absent) is fine."""
        if self.boolean(where, value) is True:
            self.refuse(where, value, f"must be false: {why}")


def _nvidia_name(name: str) -> str:
    """NVIDIA's plugin prefixes a bare resource name with nvidia.com/."""
    return name if "/" in name else f"nvidia.com/{name}"


#: Foreign forms advertise no compute, memory or TFLOPS share resources (their plugins have
#: none).
NO_SHARES: dict[str, list[str]] = {"share": [], "memory": [], "tflops": []}


def _nvidia(data: Mapping[str, Any], r: _Reader) -> dict[str, Any]:
    # Only what NVIDIA's plugin advertises: whole cards (or their replicas), no share
    # resources; a node brought over unchanged offers what it offered before.
    out: dict[str, Any] = {"resources": {"gpu": NVIDIA_GPU, **NO_SHARES},
                           # NVIDIA's default: the container runtime adds the device nodes.
                           "deviceSpecs": False}
    r.mapping("", data, ("version", "flags", "resources", "sharing", "imex"))
    flags = r.mapping("flags", data.get("flags"), _NVIDIA_FLAGS)
    if "migStrategy" in flags:
        value = flags["migStrategy"]
        if r.check("flags.migStrategy", value, lambda v: v in ("none", "single", "mixed"),
                   "must be none, single or mixed"):
            out["migStrategy"] = value
    # Accepted and ignored: the agent always refuses to advertise anything when it cannot
    # start, finds the driver through NVML, and recovers unhealthy cards itself.
    for key in ("failOnInitError", "restartOnDeviceUnhealthy"):
        if key in flags:
            r.boolean(f"flags.{key}", flags[key])
    for key in ("nvidiaDriverRoot", "nvidiaDevRoot"):
        if key in flags:
            r.absolute_path(f"flags.{key}", flags[key])
    for key, what in (("gdsEnabled", "GPUDirect Storage"), ("mofedEnabled", "MOFED")):
        if key in flags:
            r.false_only(f"flags.{key}", flags[key],
                         f"the agent does not pass {what} devices to containers")
    plugin = r.mapping("flags.plugin", flags.get("plugin"),
                       ("passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy",
                        "cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot"))
    if "passDeviceSpecs" in plugin:
        specs = r.boolean("flags.plugin.passDeviceSpecs", plugin["passDeviceSpecs"])
        if specs is not None:
            out["deviceSpecs"] = specs
    if "deviceListStrategy" in plugin:
        value = plugin["deviceListStrategy"]
        r.check("flags.plugin.deviceListStrategy", value,
                lambda v: v == "envvar" or v == ["envvar"],
                "must be envvar: the agent hands cards to containers in NVIDIA_VISIBLE_DEVICES "
                "(volume-mounts and CDI are not supported)")
    if "deviceIDStrategy" in plugin:
        r.check("flags.plugin.deviceIDStrategy", plugin["deviceIDStrategy"],
                lambda v: v == "uuid", "must be uuid: the agent names cards by UUID")
    if "cdiAnnotationPrefix" in plugin:  # only used by the CDI strategies, refused above
        r.string("flags.plugin.cdiAnnotationPrefix", plugin["cdiAnnotationPrefix"])
    for key in ("nvidiaCTKPath", "containerDriverRoot"):
        if key in plugin:
            r.absolute_path(f"flags.plugin.{key}", plugin[key])
    # GPU feature discovery shares the file; its settings are not the agent's, but they are
    # typed as GFD types them, so that a file the agent accepts is one GFD accepts too.
    gfd = r.mapping("flags.gfd", flags.get("gfd"),
                    ("oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile"))
    for key in ("oneshot", "noTimestamp"):
        if key in gfd:
            r.boolean(f"flags.gfd.{key}", gfd[key])
    if "sleepInterval" in gfd:
        r.check("flags.gfd.sleepInterval", gfd["sleepInterval"],
                lambda v: isinstance(v, str) and _GO_DURATION.match(v) is not None,
                "must be a duration such as 60s, 5m or 1h30m (a string)")
    for key in ("outputFile", "machineTypeFile"):
        if key in gfd:
            r.absolute_path(f"flags.gfd.{key}", gfd[key])
    resources = r.mapping("resources", data.get("resources"), ("gpus", "mig"))
    for key in ("gpus", "mig"):
        if key in resources:
            r.check(f"resources.{key}", resources[key], lambda v: v == [] or v is None,
                    "must be empty: renaming resources by pattern is not supported (NVIDIA's "
                    "plugin ignores it too)")
    sharing = r.mapping("sharing", data.get("sharing"), ("timeSlicing", "mps"))
    if sharing.get("mps") not in (None, {}):
        r.refuse("sharing.mps", sharing["mps"],
                 "NVIDIA's MPS replicas are not supported; write the Elastic GPU form with "
                 "sharing.mode: mps and share resources instead")
    if "timeSlicing" in sharing:
        out["timeSlicing"] = _nvidia_slicing(sharing["timeSlicing"], r)
    imex = r.mapping("imex", data.get("imex"), ("channelIDs", "required"))
    if "channelIDs" in imex:
        r.check("imex.channelIDs", imex["channelIDs"], lambda v: v == [] or v is None,
                "must be empty: the agent does not pass IMEX channels to containers")
    if "required" in imex:
        r.false_only("imex.required", imex["required"],
                     "the agent does not pass IMEX channels to containers")
    return out


def _nvidia_slicing(value: Any, r: _Reader) -> dict[str, Any]:
    where = "sharing.timeSlicing"
    slicing = r.mapping(where, value, ("renameByDefault", "failRequestsGreaterThanOne",
                                       "resources"))
    out: dict[str, Any] = {}
    for key in ("renameByDefault", "failRequestsGreaterThanOne"):
        if key in slicing and r.boolean(f"{where}.{key}", slicing[key]) is not None:
            out[key] = slicing[key]
    if not isinstance(value, Mapping):
        return out
    items = slicing.get("resources")
    if not isinstance(items, list) or not items:
        r.refuse(f"{where}.resources", items, "must be a non-empty list of "
                 "{name: nvidia.com/gpu, replicas: N} (NVIDIA: 'no resources specified')")
        return out
    seen: set[str] = set()
    for i, item in enumerate(items):
        at = f"{where}.resources[{i}]"
        entry = r.mapping(at, item, ("name", "replicas", "rename", "devices"))
        if not isinstance(item, Mapping):
            continue
        for key in ("name", "replicas"):
            if key not in entry:
                r.problems.append(Problem(f"{at}.{key}", None, "is required"))
        name = r.string(f"{at}.name", entry["name"]) if "name" in entry else None
        if name is not None:
            full = _nvidia_name(name)
            if full in seen:
                r.refuse(f"{at}.name", name, "is listed twice")
            seen.add(full)
            r.check(f"{at}.name", name, lambda v: _nvidia_name(v) == NVIDIA_GPU,
                    f"must be {NVIDIA_GPU}: only whole cards are time-sliced here (MIG "
                    "instances are not replicated)")
        if "replicas" in entry:
            replicas = r.integer(f"{at}.replicas", entry["replicas"], 2, MAX_REPLICAS)
            if replicas is not None:
                out["replicas"] = replicas
        if "rename" in entry:
            rename = r.string(f"{at}.rename", entry["rename"])
            if rename is not None and r.check(
                    f"{at}.rename", rename,
                    lambda v: _nvidia_name(v) == f"{NVIDIA_GPU}.shared",
                    f"must be {NVIDIA_GPU}.shared: the agent can only rename replicas to "
                    "<gpu>.shared (renameByDefault)"):
                out["renameByDefault"] = True
        if "devices" in entry:
            r.check(f"{at}.devices", entry["devices"], lambda v: v == "all",
                    "must be all: every card is replicated (a count or list of cards is not "
                    "supported)")
    return out


def _ix(data: Mapping[str, Any], r: _Reader) -> dict[str, Any]:
    # Only what the IX plugin advertises: boards or chips (or their replicas), no shares: a
    # time-sliced board sold again as shares would lose replica slots to share pods.
    out: dict[str, Any] = {"resources": {"gpu": IX_GPU, **NO_SHARES}}
    r.mapping("", data, ("version", "resourceName", "flags", "sharing"))
    if "resourceName" in data:
        name = r.string("resourceName", data["resourceName"])
        if name is not None:
            spec = lookup(name)
            if r.check("resourceName", name,
                       lambda _: spec is not None and spec.measure is Measure.CARDS,
                       "must be a whole-card resource of the resource table (e.g. "
                       "iluvatar.com/gpu)"):
                out["resources"] = {"gpu": name, **NO_SHARES}
    flags = r.mapping("flags", data.get("flags"), _IX_FLAGS)
    if "splitboard" in flags:
        split = r.boolean("flags.splitboard", flags["splitboard"])
        if split is not None:
            out["splitBoard"] = split
    if "usevolcano" in flags:
        r.false_only("flags.usevolcano", flags["usevolcano"],
                     "Volcano does not place pods here; the Elastic GPU scheduler extender "
                     "assigns the cards")
    if "reset_gpu" in flags:
        r.false_only("flags.reset_gpu", flags["reset_gpu"], "the agent never resets a GPU")
    sharing = r.mapping("sharing", data.get("sharing"), ("timeSlicing", "mps"))
    slicing = r.mapping("sharing.timeSlicing", sharing.get("timeSlicing"), ("replicas",))
    if "replicas" in slicing:
        # 0 is the IX plugin's unset value: each card advertised once.
        replicas = r.integer("sharing.timeSlicing.replicas", slicing["replicas"], 0, MAX_REPLICAS)
        if replicas is not None:
            out["timeSlicing"] = {"replicas": max(replicas, 1)}
    mps = r.mapping("sharing.mps", sharing.get("mps"), ("replicas",))
    # 0 (the IX plugin's unset value) or absent only: `false` and `0.0` equal 0 in Python but
    # are no replica count.
    if mps.get("replicas") is not None and r.integer(
            "sharing.mps.replicas", mps["replicas"], 0, MAX_REPLICAS) not in (None, 0):
        r.refuse("sharing.mps.replicas", mps["replicas"],
                 "MPS replicas are not supported; write the Elastic GPU form with "
                 "sharing.mode: mps and share resources instead")
    return out


def to_agent_form(form: Form, data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` (in `form`) as the Elastic GPU form's data; raises `FormError` with every
    problem found. Settings a form does not have keep the agent's defaults."""
    if form is Form.ELASTIC_GPU:
        return dict(data)
    reader = _Reader(form)
    out = _nvidia(data, reader) if form is Form.NVIDIA else _ix(data, reader)
    if reader.problems:
        raise FormError(form, reader.problems)
    return out
