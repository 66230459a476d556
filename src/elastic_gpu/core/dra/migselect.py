"""Which MIG profiles a request of the MIG class (`mig.gpu.elasticgpu.io`) accepts: the one
reader of its CEL selectors and of its `firstAvailable` subrequests. Pure, no I/O.

Dynamic MIG's demand (`core.dra.migdemand`) and the quota's count (`core.dra.quota`) both read
a claim through here. The selectors a user writes on the MIG device's attributes and capacity
(`core.dra.devices`):

    device.attributes["gpu.elasticgpu.io"].profile == "1g.10gb"          (either side)
    device.attributes["gpu.elasticgpu.io"].profile == "1g.10gb" || ... == "2g.20gb"
    device.attributes["gpu.elasticgpu.io"].profile in ["1g.10gb", "2g.20gb"]
    device.capacity["gpu.elasticgpu.io"].memory.compareTo(quantity("20Gi")) >= 0   (or > 0)

and the class's own `device.driver == "gpu.elasticgpu.io"` and `...["gpu.elasticgpu.io"].type
== "mig"` (any profile), joined with `||` and `&&` and in parentheses; several selectors of
one request are all true at once (`&&`). Each reads as the profiles it accepts, in order of
preference: a profile equality or list as written, a memory bound as every profile of every
known model (`core.mig.profiles.MIG_MODELS`) with at least that memory, smallest first
(compute slices, then memory, plain before `+me`: on each model the first it has is
`smallest_profile_for_memory`'s), no selector as every profile (any instance). A request's
`firstAvailable` subrequests of the MIG class are DRA's prioritized list: their profiles in
the order listed. Anything else is a `SelectorError` naming what could not be read: the
caller reports it rather than guessing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.core.dra.classes import MIG_CLASS
from elastic_gpu.core.dra.devices import DRIVER, TYPE_MIG
from elastic_gpu.core.mig.profiles import MIB_PER_PROFILE_GB, MIG_MODELS
from elastic_gpu.core.quantity import QuantityError, parse_quantity
from elastic_gpu.core.resources import MigProfile, ResourceError

_ATTR = r'device\.attributes\["gpu\.elasticgpu\.io"\]\.profile'
_TOKEN = re.compile(r'''\s*(?:
    (?P<memory>device\.capacity\["gpu\.elasticgpu\.io"\]\.memory\.compareTo\(\s*quantity\(\s*
        "(?P<quantity>[^"\\]*)"\s*\)\s*\)\s*(?P<cmp>>=|>)\s*0(?![0-9.]))
  | (?P<attr>''' + _ATTR + r''')
  | (?P<fact>device\.driver|device\.attributes\["gpu\.elasticgpu\.io"\]\.type)
  | "(?P<string>[^"\\]*)"
  | (?P<op>\|\||&&|==|\(|\)|\[|\]|,|in(?![A-Za-z0-9_]))
)''', re.X)
#: the longest expression read (the API allows 10 KiB; ours are short)
MAX_EXPRESSION = 4096
#: what one MIG request may ask at most (instances of one card)
MAX_COUNT = 7


class SelectorError(ValueError):
    """A MIG request this reader cannot turn into profiles; the message says what."""


def _all_profiles() -> tuple[MigProfile, ...]:
    seen = {r.profile for m in MIG_MODELS for r in m.profiles}
    return tuple(sorted(seen, key=lambda p: (p.extra != "", p.slices, p.memory_gb, p.extra)))


#: every profile of every known model, smallest first (plain before `+me`)
ALL_PROFILES = _all_profiles()


def _union(a: Sequence[MigProfile], b: Sequence[MigProfile]) -> tuple[MigProfile, ...]:
    return (*a, *(p for p in b if p not in a))


def _meet(a: Sequence[MigProfile], b: Sequence[MigProfile]) -> tuple[MigProfile, ...]:
    return tuple(p for p in a if p in b)


def _tokens(expression: str) -> list[tuple[str, str]]:
    out, at = [], 0
    text = expression.rstrip()
    while at < len(text):
        found = _TOKEN.match(text, at)
        if found is None or found.end() == at:
            raise SelectorError(f"cannot read {text[at:at + 40]!r} (a profile by ==, || or "
                                f"in, or a memory bound by compareTo)")
        kind = next(k for k in ("memory", "attr", "fact", "string", "op") if found[k] is not None)
        value = found[kind] if kind in ("string", "op", "fact") else found.group(0).strip()
        out.append((kind, str(value)))
        at = found.end()
    return out


def _profile(name: str) -> MigProfile:
    try:
        return MigProfile.parse(name)
    except ResourceError:
        raise SelectorError(f"{name!r} is not a MIG profile name") from None


def _memory_bound(atom: str) -> tuple[MigProfile, ...]:
    found = _TOKEN.match(atom)
    assert found is not None and found["memory"] is not None
    try:
        least = parse_quantity(found["quantity"])
    except QuantityError as err:
        raise SelectorError(f"memory bound {found['quantity']!r}: {err}") from None
    strict = found["cmp"] == ">"
    mib = math.ceil(least / (1024 * 1024))
    return tuple(p for p in ALL_PROFILES
                 if (p.memory_gb * MIB_PER_PROFILE_GB > mib if strict
                     else p.memory_gb * MIB_PER_PROFILE_GB >= mib))


def _fact(subject: str, value: str) -> tuple[MigProfile, ...]:
    """`device.driver == "..."` or the `type` attribute (the class's own selector, often
    repeated in a claim): every profile when it is our MIG device's, none otherwise."""
    ours = DRIVER if subject == "device.driver" else TYPE_MIG
    return ALL_PROFILES if value == ours else ()


class _Parser:
    """`or := and ('||' and)*; and := atom ('&&' atom)*; atom := '(' or ')' | equality (of the
    profile, the driver or the type) | profile 'in' '[' strings ']' | memory bound`."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            raise SelectorError(f"expected {value or kind} at {self._where()}")
        self.at += 1
        return token[1]

    def _where(self) -> str:
        token = self.peek()
        return "the end" if token is None else repr(token[1])

    def disjunction(self) -> tuple[MigProfile, ...]:
        out = self.conjunction()
        while self.peek() == ("op", "||"):
            self.at += 1
            out = _union(out, self.conjunction())
        return out

    def conjunction(self) -> tuple[MigProfile, ...]:
        out = self.atom()
        while self.peek() == ("op", "&&"):
            self.at += 1
            out = _meet(out, self.atom())
        return out

    def atom(self) -> tuple[MigProfile, ...]:
        token = self.peek()
        if token == ("op", "("):
            self.at += 1
            out = self.disjunction()
            self.take("op", ")")
            return out
        if token is not None and token[0] == "memory":
            self.at += 1
            return _memory_bound(token[1])
        if token is not None and token[0] == "string":
            self.at += 1
            self.take("op", "==")
            subject = self.peek()
            if subject is not None and subject[0] == "fact":
                self.at += 1
                return _fact(subject[1], token[1])
            self.take("attr")
            return (_profile(token[1]),)
        if token is not None and token[0] == "fact":
            self.at += 1
            self.take("op", "==")
            return _fact(token[1], self.take("string"))
        self.take("attr")
        if self.peek() == ("op", "in"):
            self.at += 1
            self.take("op", "[")
            names = [self.take("string")]
            while self.peek() == ("op", ","):
                self.at += 1
                names.append(self.take("string"))
            self.take("op", "]")
            listed: tuple[MigProfile, ...] = ()
            for name in names:
                listed = _union(listed, (_profile(name),))
            return listed
        self.take("op", "==")
        return (_profile(self.take("string")),)


def selector_profiles(expression: str) -> tuple[MigProfile, ...]:
    """The profiles one CEL selector accepts, in order of preference; SelectorError when it is
    not of the shapes this module reads (its docstring)."""
    if len(expression) > MAX_EXPRESSION:
        raise SelectorError(f"a selector of {len(expression)} characters")
    parser = _Parser(_tokens(expression))
    out = parser.disjunction()
    if parser.peek() is not None:
        raise SelectorError(f"unexpected {parser._where()}")
    return out


@dataclass(frozen=True)
class MigAsk:
    """What one request of a claim asks of the MIG class: `count` instances, each of one of
    `profiles` (in order of preference)."""

    request: str
    profiles: tuple[MigProfile, ...]
    count: int = 1
    #: per profile, the `firstAvailable` subrequest it is first accepted by ("" for
    #: `exactly`): an allocation result names `<request>/<subrequest>`, as DRA's allocator does
    via: tuple[str, ...] = ()

    def result_request(self, profile: MigProfile) -> str:
        """The `request` an allocation result of an instance of `profile` names."""
        sub = self.via[self.profiles.index(profile)] if self.via else ""
        return f"{self.request}/{sub}" if sub else self.request


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def exactly_profiles(exactly: Mapping[str, Any]) -> tuple[MigProfile, ...]:
    """The profiles an `exactly` (or subrequest) accepts: all its selectors at once; none is
    any profile."""
    out: tuple[MigProfile, ...] | None = None
    for selector in exactly.get("selectors") or []:
        expression = _mapping(_mapping(selector).get("cel")).get("expression")
        if not isinstance(expression, str):
            raise SelectorError("a selector without a CEL expression")
        accepted = selector_profiles(expression)
        out = accepted if out is None else _meet(out, accepted)
    return ALL_PROFILES if out is None else out


def _count(exactly: Mapping[str, Any]) -> int:
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        raise SelectorError(f"allocationMode {exactly.get('allocationMode')}")
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_COUNT:
        raise SelectorError(f"count {count!r} (1 to {MAX_COUNT} instances)")
    return count


def request_ask(request: Mapping[str, Any]) -> MigAsk | None:
    """One claim request's MIG ask: `exactly` of the MIG class, or the MIG-class subrequests of
    `firstAvailable` in the order listed (all of one count; the others are not MIG demand);
    None when it asks nothing of the MIG class. SelectorError when it cannot be read."""
    name = str(request.get("name", ""))
    exactly = request.get("exactly")
    options = [exactly] if isinstance(exactly, Mapping) else \
        [s for s in request.get("firstAvailable") or [] if isinstance(s, Mapping)]
    options = [o for o in options if o.get("deviceClassName") == MIG_CLASS]
    if not options:
        return None
    profiles: tuple[MigProfile, ...] = ()
    via: list[str] = []
    counts = set()
    try:
        for option in options:
            counts.add(_count(option))
            added = [p for p in exactly_profiles(option) if p not in profiles]
            profiles = (*profiles, *added)
            sub = "" if option is exactly else str(option.get("name", ""))
            via += [sub] * len(added)
    except SelectorError as err:
        raise SelectorError(f"request {name}: {err}") from None
    if len(counts) > 1:
        raise SelectorError(f"request {name}: firstAvailable subrequests of {sorted(counts)} "
                            f"instances (one count for all is read)")
    if not profiles:
        raise SelectorError(f"request {name}: no MIG profile of a known model is accepted")
    return MigAsk(name, profiles, counts.pop(), tuple(via))


def mig_asks(spec: Mapping[str, Any]) -> tuple[list[MigAsk], list[str]]:
    """A claim spec's MIG asks, one per request of the MIG class, and what could not be read
    (one sentence per request)."""
    asks: list[MigAsk] = []
    problems: list[str] = []
    for request in _mapping(spec.get("devices")).get("requests") or []:
        try:
            ask = request_ask(_mapping(request))
        except SelectorError as err:
            problems.append(str(err))
            continue
        if ask is not None:
            asks.append(ask)
    return asks, problems
