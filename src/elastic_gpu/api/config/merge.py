"""How a component's flags and its settings file make one settings object, and how a key's
old spelling is still read: the one rule every component follows (`loader.load_settings`).

Precedence, as NVIDIA's k8s-device-plugin merges its flags into its config file: a flag given
on the command line (or through its environment variable) wins; otherwise the file's value;
otherwise the model's default. A flag not given is None here (its command declares it without
a default of its own), so the default lives in one place, the model, and a flag left out
never hides what the file says.

Every key has one spelling (camelCase; a duration ends in `Seconds`); a key renamed keeps its
old spelling readable through a `Rename`: the value moves to the new key before the model
reads it, and the caller logs one warning naming the new key. A file that gives both
spellings is refused (which one it meant is a guess).

Pure: plain data in, plain data out; the loader validates the result with the model.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Override:
    """One flag's value for one key: `path` is the key's dotted path in the file
    (`leaderElection.leaseDurationSeconds`), `flag` the option that sets it
    (`--lease-duration`), `value` None when the flag was not given."""

    path: str
    flag: str
    value: Any

    @property
    def given(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class Rename:
    """A key's old spelling (`old`, dotted path) and its spelling now (`new`)."""

    old: str
    new: str


class BothSpellings(ValueError):
    """A file that gives a key under its old and its new spelling."""

    def __init__(self, rename: Rename) -> None:
        super().__init__(f"given as {rename.new} and as its old spelling {rename.old}: "
                         f"keep {rename.new} only")
        self.rename = rename


def _parent(data: dict[str, Any], path: str, create: bool) -> tuple[dict[str, Any], str] | None:
    """The mapping that holds the last key of `path` in `data`, and that key; None when a key
    on the way is missing (and not `create`) or holds no mapping (the model refuses that)."""
    *outer, last = path.split(".")
    here = data
    for key in outer:
        inner = here.get(key)
        if inner is None and create:
            inner = here[key] = {}
        if not isinstance(inner, dict):
            return None
        here = inner
    return here, last


def with_new_spellings(data: Mapping[str, Any],
                       renames: Iterable[Rename]) -> tuple[dict[str, Any], list[Rename]]:
    """`data` with every old spelling moved to its new key, and the renames that moved one
    (for the caller's warnings); `BothSpellings` when a file gives both."""
    out = copy.deepcopy(dict(data))
    used = []
    for rename in renames:
        found = _parent(out, rename.old, create=False)
        if found is None or found[1] not in found[0]:
            continue
        holder, key = found
        target = _parent(out, rename.new, create=True)
        if target is None:
            continue  # the new key's parent is no mapping: the model refuses the file there
        if target[1] in target[0]:
            raise BothSpellings(rename)
        target[0][target[1]] = holder.pop(key)
        used.append(rename)
    return out, used


def with_overrides(data: Mapping[str, Any], overrides: Iterable[Override]) -> dict[str, Any]:
    """`data` with each given flag's value at its key (mappings on the way made as needed);
    a key whose parent is no mapping is left for the model to refuse."""
    out = copy.deepcopy(dict(data))
    for override in overrides:
        if not override.given:
            continue
        target = _parent(out, override.path, create=True)
        if target is not None:
            target[0][target[1]] = override.value
    return out


def written_field(field: str, used: Iterable[Rename]) -> str:
    """A problem's field as the file wrote it: under an old spelling read as its new key,
    `old (now new)`, so the user finds the line."""
    for rename in used:
        if field == rename.new or field.startswith((rename.new + ".", rename.new + "[")):
            return f"{rename.old}{field[len(rename.new):]} (now {rename.new})"
    return field


def flag_field(field: str, overrides: Iterable[Override]) -> str:
    """A problem's field as the user wrote it: `--flag (path)` when a given flag set it, and
    `path (set by --a, --b)` when given flags set keys inside it (a rule between two keys)."""
    given = [o for o in overrides if o.given]
    for override in given:
        if override.path == field:
            return f"{override.flag} ({field})"
    inside = [o.flag for o in given if o.path.startswith(field + ".")]
    return f"{field} (set by {', '.join(inside)})" if inside else field
