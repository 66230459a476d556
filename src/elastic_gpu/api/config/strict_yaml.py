"""The YAML reader of every configuration file the project reads (agent, scheduler, controller,
sandbox cluster files): YAML 1.2 core-schema scalars, and bounds that make hostile input a
clear refusal instead of a crash or a hang.

PyYAML implements YAML 1.1, where `yes`, `on`, `no`, `off` are booleans, `010` is octal 8,
`1_000` is 1000, `1:30` is 90 and `2001-12-14` a date. A config reader must not guess like
that: here only true/false (YAML 1.2's spellings) are booleans, only plain decimal integers are
integers, only plain decimal numbers are numbers, and everything else stays a string for the
field's own check to refuse.

What a config file cannot hold, each refused with the line and column (issue #26, item 13):
- anchors and aliases (`&a`, `*a`): a "billion laughs" file of a few hundred bytes expands to
  billions of nodes; a config has no use for them, so they are refused, not bounded;
- nesting deeper than `MAX_DEPTH` mappings and lists (the composer recurses per level, so
  20,000 levels were a RecursionError);
- integers longer than `MAX_INT_DIGITS` digits (Python refuses to convert 4,300 digits and
  more, and no setting needs more than 18) and numbers longer than `MAX_NUMBER_CHARS`;
- keys that are not strings (`? [a, b]`, `1: x`, `null: x`), and a key given twice;
- tags other than the core schema's (`!!binary`, `!!set`, `!!timestamp`, `!!python/...`),
  and a scalar that does not fit the core tag it is given (`!!int 0x10`, `!!bool yes`);
- text that is not UTF-8 (`decode`), and more than one document.

Pure: text (or bytes) in, plain data (dict, list, str, int, float, bool, None) out.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

#: Mappings and lists inside each other; the deepest shipped config nests 5.
MAX_DEPTH = 32
#: An integer's digits (int64 has 19; no setting needs more than a few).
MAX_INT_DIGITS = 18
#: A number's characters, sign and exponent included.
MAX_NUMBER_CHARS = 32

STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"

_BOOL_TEXT = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT_TEXT = re.compile(r"^(?:0|-?[1-9][0-9]*)$")
_FLOAT_TEXT = re.compile(r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?$")
_NULL_TEXT = re.compile(r"^(?:~|null|Null|NULL|)$")


class YamlRefused(yaml.YAMLError):
    """Input the reader refuses before parsing (not UTF-8)."""


class Refusal(ComposerError):
    """A document the reader refuses while composing it: `field` is where (`a.b[2]`,
    `(top level)`), `rule` what it breaks; the message adds the line and column."""

    def __init__(self, field: str, rule: str, mark: Any) -> None:
        super().__init__(None, None, f"{field}: {rule}", mark)
        self.field = field
        self.rule = rule


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars and the bounds above, checked
    while the document is composed, before anything is built from it, so that each refusal
    names the field it is found in (`timeSlicing.replicas`, `nodeGroups[0].agentConfig`)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        #: Where the node being composed is: mapping values' key nodes and list indexes.
        self._path: list[Node | int | None] = []

    def _refuse(self, problem: str, mark: Any, index: Node | int | None = None,
                own: bool = False) -> Refusal:
        path = [*self._path, index] if own else self._path
        return Refusal(field_path(path), problem, mark)

    def descend_resolver(self, current_node: Node | None, current_index: Any) -> None:
        self._path.append(current_index)
        super().descend_resolver(current_node, current_index)

    def ascend_resolver(self) -> None:
        self._path.pop()
        super().ascend_resolver()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, AliasEvent) or event.anchor is not None:
            what = f"alias *{event.anchor}" if isinstance(event, AliasEvent) else \
                f"anchor &{event.anchor}"
            raise self._refuse(f"{what}: anchors and aliases are not allowed in a config file "
                               "(write the value out)", mark, index, own=True)
        nested = isinstance(event, MappingStartEvent | SequenceStartEvent)
        if nested and len(self._path) > MAX_DEPTH:
            raise self._refuse(f"nested deeper than {MAX_DEPTH} mappings and lists", mark,
                               index, own=True)
        node = super().compose_node(parent, index)
        if isinstance(parent, MappingNode) and index is None and node is not None:
            self._check_key(parent, node)
        return node

    def _check_key(self, mapping: MappingNode, key: Node) -> None:
        if not isinstance(key, ScalarNode) or key.tag != STR:
            raise self._refuse(f"key {_shown(key)}: keys must be strings", key.start_mark)
        if any(known.value == key.value for known, _ in mapping.value):
            raise self._refuse(f"key {key.value!r} is given twice", key.start_mark)

    def compose_scalar_node(self, anchor: Any) -> ScalarNode:
        node: ScalarNode = super().compose_scalar_node(anchor)
        mark: Any = node.start_mark
        if node.tag not in _CORE_TAGS:
            raise self._refuse(f"tag {node.tag}: only plain mappings, lists, strings, numbers, "
                               "true/false and null are allowed in a config file", mark)
        pattern, what = _CORE_TAGS[node.tag]
        if pattern is not None and not pattern.match(node.value):
            raise self._refuse(f"{_shown(node)} is not {what}", mark)
        digits = len(node.value.lstrip("-"))
        if node.tag == _INT and digits > MAX_INT_DIGITS:
            raise self._refuse(f"an integer of {digits} digits: at most {MAX_INT_DIGITS} digits",
                               mark)
        if node.tag == _FLOAT and len(node.value) > MAX_NUMBER_CHARS:
            raise self._refuse(f"a number of {len(node.value)} characters: at most "
                               f"{MAX_NUMBER_CHARS}", mark)
        return node

    def compose_sequence_node(self, anchor: Any) -> SequenceNode:
        node: SequenceNode = super().compose_sequence_node(anchor)
        if node.tag != _SEQ:
            raise self._refuse(f"tag {node.tag} on a list: only plain lists", node.start_mark)
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if event.tag not in (None, "!", _MAP):
            mark: Any = event.start_mark
            raise self._refuse(f"tag {event.tag} on a mapping: only plain mappings", mark)
        node: MappingNode = super().compose_mapping_node(anchor)
        return node


def field_path(path: list[Node | int | None]) -> str:
    """`a.b[2].c` from the composer's path (key nodes, list indexes; None: inside a key)."""
    text = ""
    for step in path[1:]:  # path[0] is the document's root
        if isinstance(step, int):
            text += f"[{step}]"
        elif isinstance(step, ScalarNode):
            text += f".{step.value}"
        elif step is None:
            text += " (a key)"
        else:
            text += ".(a key that is not a string)"
    return text.removeprefix(".") or "(top level)"


def _shown(node: Node) -> str:
    """A node as an error shows it: a scalar's text, else its kind (not its whole value)."""
    if isinstance(node, ScalarNode):
        text = repr(node.value)
        return text if len(text) <= 40 else text[:37] + "..."
    return "a mapping" if isinstance(node, MappingNode) else "a list"


def _construct_int(loader: _Loader, node: ScalarNode) -> int:
    return int(node.value)


def _construct_float(loader: _Loader, node: ScalarNode) -> float:
    return float(node.value)


def _construct_bool(loader: _Loader, node: ScalarNode) -> bool:
    return str(node.value).lower() == "true"


def _construct_null(loader: _Loader, node: ScalarNode) -> None:
    return None


_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
#: The scalar tags of the core schema and what a scalar given that tag must look like (an
#: explicit `!!int 0x10` or `!!bool yes` is refused, not converted).
_CORE_TAGS: dict[str, tuple[re.Pattern[str] | None, str]] = {
    STR: (None, "a string"),
    _INT: (_INT_TEXT, "a decimal integer"),
    _FLOAT: (_FLOAT_TEXT, "a decimal number"),
    _BOOL: (_BOOL_TEXT, "true or false"),
    _NULL: (_NULL_TEXT, "null"),
}
# Only the core schema (the composer has refused every other tag already).
_Loader.yaml_constructors = {
    STR: yaml.SafeLoader.yaml_constructors[STR],
    _SEQ: yaml.SafeLoader.yaml_constructors[_SEQ],
    _MAP: yaml.SafeLoader.yaml_constructors[_MAP],
    _INT: _construct_int,
    _FLOAT: _construct_float,
    _BOOL: _construct_bool,
    _NULL: _construct_null,
}
# The implicit resolvers of YAML 1.2's core schema (no merge `<<`, no timestamps, no `=`,
# no .inf/.nan: a number is a finite decimal).
_Loader.yaml_implicit_resolvers = {}
_Loader.add_implicit_resolver(_BOOL, _BOOL_TEXT, list("tTfF"))
_Loader.add_implicit_resolver(_INT, _INT_TEXT, list("-0123456789"))
_Loader.add_implicit_resolver(_FLOAT, _FLOAT_TEXT, list("-0123456789"))
_Loader.add_implicit_resolver(_NULL, _NULL_TEXT, ["~", "n", "N", ""])


def read_yaml(text: str, source: str = "<text>") -> Any:
    """One YAML document as plain data; `yaml.YAMLError` (with `source`, line and column) for
    anything the rules above refuse."""
    loader = _Loader(text)
    loader.name = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def decode(data: bytes) -> str:
    """`data` as UTF-8 text (a leading byte-order mark allowed); `YamlRefused` naming the
    offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise YamlRefused(f"byte 0x{data[err.start]:02x} at offset {err.start} is not UTF-8: "
                          "a config file must be UTF-8 text") from None


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any) -> str:
    """`data` as a config file `read_yaml` reads back: PyYAML's dumper writes an anchor and an
    alias for an object that appears twice (a list of one card dict repeated), which the
    reader refuses; this one writes each value out."""
    text: str = yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=False)
    return text
