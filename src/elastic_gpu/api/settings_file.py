"""The one loader of every component's YAML settings file: `egpu agent --config`, `egpu
scheduler --config`, `egpu controller --config` and `egpu sandbox up --cluster` (each also
through `--check`).

One reading, so that every component refuses the same hostile input the same way and every
error names the file, then each field's path, the value given and the rule it breaks:
- the file: an existing regular file (not a directory or a FIFO that would block the read) of
  at most `MAX_FILE_BYTES`, UTF-8 text;
- its YAML: `strict_yaml` (YAML 1.2 scalars; no anchors or aliases, bounded nesting and number
  lengths, string keys only, no key twice);
- its version: an optional header `apiVersion: elasticgpu.io/v1alpha1` with the component's
  `kind` (AgentConfig, SchedulerConfig, ControllerConfig, SandboxCluster); a file without the
  header is read as that version, a file with another version or kind is refused, so that a
  later version can change the schema without a file being read in the wrong one;
- its fields: the component's pydantic model (unknown keys refused; every number ranged).
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from elastic_gpu.api.strict_yaml import decode, read_yaml

Settings = TypeVar("Settings", bound=BaseModel)

#: The largest settings file read (the largest shipped one is a few KiB).
MAX_FILE_BYTES = 1 << 20
#: The version of every component's settings file, written in its optional header.
API_VERSION = "elasticgpu.io/v1alpha1"
HEADER_KEYS = ("apiVersion", "kind")


class SettingsFileError(ValueError):
    """A settings file that cannot be read as YAML data; the message names the file."""


def read_file(path: Path) -> Any:
    """The YAML data in `path` (None for an empty file); `SettingsFileError` when it is no
    regular file, too large, not UTF-8 or not YAML the strict reader accepts."""
    try:
        info = path.stat()
    except OSError as err:
        raise SettingsFileError(f"{path}: cannot read: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SettingsFileError(f"{path}: cannot read: not a regular file")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise SettingsFileError(f"{path}: cannot read: {err.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SettingsFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes: not a settings "
                                "file")
    try:
        return read_yaml(decode(data), str(path))
    except yaml.YAMLError as err:
        raise SettingsFileError(f"{path}: not valid YAML: {err}") from None


_YAML_TYPES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping", type(None): "null"}


def describe(value: Any) -> str:
    """A value as the error messages show it: its repr, shortened, and its YAML type."""
    kind = _YAML_TYPES.get(type(value), type(value).__name__)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        text = f"an integer of {len(hex(value)) - 2} hex digits"  # str() of it may raise
    else:
        text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


def header_problems(data: Mapping[str, Any], kind: str) -> list[str]:
    """What is wrong with the optional header (`apiVersion` and `kind`) of a settings file of
    `kind`: one line per problem, none when it is absent or right."""
    if not any(key in data for key in HEADER_KEYS):
        return []
    problems = []
    if data.get("apiVersion") != API_VERSION:
        problems.append(f"  apiVersion: got {describe(data.get('apiVersion'))}: must be "
                        f"{API_VERSION!r} (the only version; or leave out apiVersion and kind)")
    if data.get("kind") != kind:
        problems.append(f"  kind: got {describe(data.get('kind'))}: must be {kind!r} with "
                        "apiVersion (this file is read as that kind)")
    return problems


def without_header(data: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key not in HEADER_KEYS}


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


def field_problems(err: ValidationError) -> list[str]:
    """One line per field of `err`: `  <path>: got <value> (<type>): <rule>`."""
    lines = []
    for item in err.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        where = where.removeprefix(".") or "(top level)"
        rule = _RULES.get(item["type"], str(item["msg"]).removeprefix("Value error, "))
        if item["type"] == "missing" or not item["loc"]:
            lines.append(f"  {where}: {rule}")
        else:
            lines.append(f"  {where}: got {describe(item['input'])}: {rule}")
    return lines


def load_settings(path: Path | None, model: type[Settings], error: type[Exception],
                  kind: str) -> Settings:
    """The settings in `path` (its defaults without one; an empty file is all defaults);
    anything wrong raises `error` with one message: the file, then every problem found."""
    if path is None:
        return model()
    try:
        data = read_file(path)
    except SettingsFileError as err:
        raise error(str(err)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{path}: must be a mapping of settings, got {type(data).__name__}")
    problems = header_problems(data, kind)
    if problems:
        raise error(f"{path}: invalid {kind}:\n" + "\n".join(problems))
    try:
        return model.model_validate(without_header(data))
    except ValidationError as err:
        raise error(f"{path}: invalid {kind}:\n" + "\n".join(field_problems(err))) from None
