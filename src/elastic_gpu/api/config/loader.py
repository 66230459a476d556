"""The one loader of every component's YAML settings file: `egpu agent --config`, `egpu
scheduler --config`, `egpu controller --config`, `egpu webhook --config` and `egpu sandbox up
--cluster` (each also through `--check`), and the one `ConfigError` every refusal of them is.

One reading, so that every component refuses the same hostile input the same way and every
error names the file, then each field's path, the value given and the rule it breaks:
- the file: an existing regular file (not a directory or a FIFO that would block the read) of
  at most `MAX_FILE_BYTES`, UTF-8 text;
- its YAML: `strict_yaml` (YAML 1.2 scalars; no anchors or aliases, bounded nesting and number
  lengths, string keys only, no key twice);
- its version: an optional header `apiVersion: elasticgpu.io/v1alpha1` with the component's
  `kind` (`KINDS`); a file without the header is read as that version of the kind the command
  expects, a file with another version or kind is refused listing the known ones, so that a
  later version can change the schema without a file being read in the wrong one;
- its keys: an old spelling a component lists (`merge.Rename`) is read as the new key, with
  one warning naming it;
- the flags: a flag given on the command line beats the file's value, which beats the
  model's default (`merge.Override`; one rule for every component);
- its fields: the component's pydantic model (unknown keys refused; every number ranged).

Every refusal is a `ConfigError` whose message names the file, then one line per problem,
`  FIELD: got VALUE (TYPE): RULE`; the problems are also kept as `Problem`s (field, value,
rule) for code that wants them without parsing the text.
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from elastic_gpu.api.config.merge import (
    BothSpellings,
    Override,
    Rename,
    flag_field,
    with_new_spellings,
    with_overrides,
    written_field,
)
from elastic_gpu.api.config.strict_yaml import Refusal, YamlRefused, decode, read_yaml
from elastic_gpu.api.group import CONFIG_API_VERSION

Settings = TypeVar("Settings", bound=BaseModel)

log = logging.getLogger(__name__)

#: The largest settings file read (the largest shipped one is a few KiB).
MAX_FILE_BYTES = 1 << 20
#: The version of every component's settings file, written in its optional header (the only
#: one so far: a v1alpha2 gets its own entry here and its own models).
API_VERSIONS = (CONFIG_API_VERSION,)
HEADER_KEYS = ("apiVersion", "kind")
#: Every kind of settings file and what reads it.
KINDS = {
    "AgentConfig": "egpu agent --config",
    "SchedulerConfig": "egpu scheduler --config",
    "ControllerConfig": "egpu controller --config",
    "WebhookConfig": "egpu webhook --config",
    "SandboxCluster": "egpu sandbox up --cluster",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a settings file: where (`timeSlicing.replicas`, `(top level)`),
    the value found as `describe` shows it (None when the problem is a missing or misplaced
    key, or in the YAML text itself), and the rule it breaks."""

    field: str
    value: str | None
    rule: str

    def line(self) -> str:
        if self.value is None:
            return f"  {self.field}: {self.rule}"
        return f"  {self.field}: got {self.value}: {self.rule}"


class ConfigError(ValueError):
    """A settings file (or settings data) that cannot be used: the one error of every
    component's config. The message names the file, then each problem; `problems` holds
    them as field, value and rule (empty when the file could not be read at all)."""

    def __init__(self, message: str, problems: Iterable[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)

    @classmethod
    def invalid(cls, source: str, what: str, problems: Iterable[Problem]) -> ConfigError:
        """`SOURCE: WHAT:` and one line per problem (`what`: "invalid SchedulerConfig")."""
        found = tuple(problems)
        return cls(f"{source}: {what}:\n" + "\n".join(p.line() for p in found), found)

    @property
    def field(self) -> str | None:
        return self.problems[0].field if self.problems else None

    @property
    def value(self) -> str | None:
        return self.problems[0].value if self.problems else None

    @property
    def rule(self) -> str | None:
        return self.problems[0].rule if self.problems else None


def read_file(path: Path) -> Any:
    """The YAML data in `path` (None for an empty file); `ConfigError` when it is no
    regular file, too large, not UTF-8 or not YAML the strict reader accepts."""
    try:
        info = path.stat()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: cannot read: not a regular file")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES} bytes: not a settings file")
    return read_text(decode_file(data, path), str(path))


def decode_file(data: bytes, path: Path) -> str:
    try:
        return decode(data)
    except YamlRefused as err:
        raise ConfigError(f"{path}: not valid YAML: {err}",
                          [Problem("(file)", None, str(err))]) from None


def read_text(text: str, source: str) -> Any:
    """YAML `text` (a file's, or a ConfigMap key's) as plain data; `ConfigError` naming
    `source` for anything `strict_yaml` refuses."""
    try:
        return read_yaml(text, source)
    except yaml.YAMLError as err:
        problems = [Problem(err.field, None, err.rule)] if isinstance(err, Refusal) else []
        raise ConfigError(f"{source}: not valid YAML: {err}", problems) from None


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


def header_problems(data: Mapping[str, Any], kind: str) -> list[Problem]:
    """What is wrong with the optional header (`apiVersion` and `kind`) of a settings file of
    `kind`: one problem each, none when the header is absent or right. A kind of another
    command's file names that command; an unknown one lists the known kinds."""
    if not any(key in data for key in HEADER_KEYS):
        return []
    problems = []
    version = data.get("apiVersion")
    if version not in API_VERSIONS:
        problems.append(Problem("apiVersion", describe(version),
                                f"must be {CONFIG_API_VERSION!r} (the only version; or leave "
                                "out apiVersion and kind)"))
    given = data.get("kind")
    if given != kind:
        whose = f"; known kinds: {', '.join(KINDS)}"
        if isinstance(given, str) and given in KINDS:
            whose = f"; {given} is read by {KINDS[given]}{whose}"
        problems.append(Problem("kind", describe(given),
                                f"must be {kind!r} with apiVersion (this file is read as that "
                                f"kind{whose})"))
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


def field_problems(err: ValidationError) -> list[Problem]:
    """One problem per field of `err` (`  <path>: got <value> (<type>): <rule>` as a line)."""
    problems = []
    for item in err.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        where = where.removeprefix(".") or "(top level)"
        rule = _RULES.get(item["type"], str(item["msg"]).removeprefix("Value error, "))
        if item["type"] == "missing" or not item["loc"]:
            problems.append(Problem(where, None, rule))
        else:
            problems.append(Problem(where, describe(item["input"]), rule))
    return problems


def merged_problems(err: ValidationError, overrides: Iterable[Override],
                    used: Iterable[Rename]) -> list[Problem]:
    """`field_problems` of a file merged with flags, each named as the user wrote it: the flag
    that set the field, else the key's old spelling when the file used one."""
    overrides, used = list(overrides), list(used)
    found = []
    for problem in field_problems(err):
        field = flag_field(problem.field, overrides)
        if field == problem.field:
            field = written_field(field, used)
        found.append(Problem(field, problem.value, problem.rule))
    return found


def load_settings(path: Path | None, model: type[Settings], kind: str, *,
                  overrides: Iterable[Override] = (), renames: Iterable[Rename] = ()) -> Settings:
    """The settings of `kind`: `path`'s (an empty file, or none, is all defaults) with the
    given flags' `overrides` on top (`merge`: flag, then file, then default) and each old
    spelling in `renames` read as its new key (one warning per old key and process).
    Anything wrong raises `ConfigError`: the source, then every problem found, a flag's by
    its name and key."""
    overrides = tuple(overrides)
    source = str(path) if path is not None else "flags"
    data: Any = {} if path is None else read_file(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of settings, got {type(data).__name__}",
                          [Problem("(top level)", describe(data), "must be a mapping of "
                                   "settings")])
    problems = header_problems(data, kind)
    if problems:
        raise ConfigError.invalid(source, f"invalid {kind}", problems)
    data, used = new_spellings(without_header(data), renames, source, kind)
    try:
        return model.model_validate(with_overrides(data, overrides))
    except ValidationError as err:
        raise ConfigError.invalid(source, f"invalid {kind}",
                                  merged_problems(err, overrides, used)) from None


def new_spellings(data: Mapping[str, Any], renames: Iterable[Rename], source: str,
                  kind: str) -> tuple[dict[str, Any], list[Rename]]:
    """`data` with each old spelling in `renames` moved to its new key, and the renames used
    (`merge.written_field` names a problem under them as written); one warning per old key
    and process; `ConfigError` naming the old key when the file gives both."""
    try:
        moved, used = with_new_spellings(data, renames)
    except BothSpellings as err:
        raise ConfigError.invalid(source, f"invalid {kind}",
                                  [Problem(err.rename.old, None, str(err))]) from None
    for rename in used:
        warn_old_spelling(source, kind, rename)
    return moved, used


#: The old spellings warned about so far (kind, old key): one warning each per process, as
#: a config is read again on every `--check` and by tests.
_WARNED: set[tuple[str, str]] = set()


def warn_old_spelling(source: str, kind: str, rename: Rename) -> None:
    if (kind, rename.old) in _WARNED:
        return
    _WARNED.add((kind, rename.old))
    log.warning("%s: %s is the old spelling of %s: read as %s; write %s (the old spelling "
                "will be refused in a later apiVersion)", source, rename.old, rename.new,
                rename.new, rename.new)
