"""The one YAML reader of every config file (`strict_yaml`) and the settings loader around it
(`api.config.loader`): what a config file cannot hold is refused naming where it is, never a
crash or a hang (issue #26, item 13)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from elastic_gpu.api.config.loader import MAX_FILE_BYTES, ConfigError, header_problems, read_file
from elastic_gpu.api.config.strict_yaml import MAX_DEPTH, decode, read_yaml


@pytest.mark.parametrize(("text", "words"), [
    ("a: " + "9" * 19 + "\n", "a: an integer of 19 digits: at most 18 digits"),
    ("a: -" + "9" * 5000 + "\n", "a: an integer of 5000 digits"),
    ("a: 1" + "0" * 40 + ".5\n", "a: a number of 43 characters: at most 32"),
    ("? [a, b]\n: 1\n", "(top level): key a list: keys must be strings"),
    ("b: {? {x: 1} : 2}\n", "b: key a mapping: keys must be strings"),
    ("1: x\n", "key '1': keys must be strings"),
    ("true: x\n", "key 'true': keys must be strings"),
    ("~: x\n", "key '~': keys must be strings"),
    ("a: {b: 1, b: 2}\n", "a: key 'b' is given twice"),
    ("a: &x 1\nb: *x\n", "a: anchor &x: anchors and aliases are not allowed"),
    ("a: [1, *x]\n", "a[1]: alias *x: anchors and aliases are not allowed"),
    ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n", "nested deeper than"),
    ("a: !!binary aGk=\n", "a: tag tag:yaml.org,2002:binary"),
    ("a: !!python/object/apply:os.system [ls]\n", "a: tag tag:yaml.org,2002:python/"),
    ("a: !!set {x}\n", "a: tag tag:yaml.org,2002:set on a mapping"),
    ("a: !!int 0x10\n", "a: '0x10' is not a decimal integer"),
    ("a: !!bool yes\n", "a: 'yes' is not true or false"),
    ("a: !!float .inf\n", "a: '.inf' is not a decimal number"),
    ("a: 1\n---\nb: 2\n", "expected a single document"),
])
def test_refused_naming_where(text: str, words: str) -> None:
    with pytest.raises(yaml.YAMLError) as err:
        read_yaml(text, "f.yaml")
    assert words in str(err.value) and 'in "f.yaml", line' in str(err.value), str(err.value)


def test_deep_nesting_and_billion_laughs_end_at_once() -> None:
    with pytest.raises(yaml.YAMLError, match="nested deeper"):
        read_yaml("a: " + "[" * 100_000 + "]" * 100_000)
    laughs = "a: &a [x, x]\n" + "".join(f"{c}: &{c} [*{p}, *{p}]\n"
                                         for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    with pytest.raises(yaml.YAMLError, match="anchors and aliases"):
        read_yaml(laughs)


def test_yaml_1_2_scalars() -> None:
    assert read_yaml("a: [1, -2, 2.5, 1e3, true, False, null, ~, '', yes, 010, 1_0, 1:30, "
                     ".inf, 2001-12-14, 0x4]\n<<: {b: 1}\n") == {
        "a": [1, -2, 2.5, 1000.0, True, False, None, None, "", "yes", "010", "1_0", "1:30",
              ".inf", "2001-12-14", "0x4"],
        "<<": {"b": 1}}
    assert read_yaml("") is None


def test_bytes_must_be_utf8() -> None:
    assert decode("\ufeffa: é\n".encode()) == "a: é\n"
    with pytest.raises(yaml.YAMLError, match="byte 0xff at offset 3 is not UTF-8"):
        decode(b"a: \xff\n")


def test_read_file_wants_a_small_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        read_file(tmp_path)
    with pytest.raises(ConfigError, match="cannot read: No such file"):
        read_file(tmp_path / "missing.yaml")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigError, match=f"larger than {MAX_FILE_BYTES} bytes"):
        read_file(big)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: \xc3\x28\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: .*byte 0xc3 at offset 3"):
        read_file(bad)


def test_header() -> None:
    assert header_problems({"a": 1}, "AgentConfig") == []
    assert header_problems({"apiVersion": "elasticgpu.io/v1alpha1", "kind": "AgentConfig"},
                           "AgentConfig") == []
    (only,) = header_problems({"kind": "AgentConfig"}, "AgentConfig")
    assert "apiVersion: got None" in only.line()
    assert len(header_problems({"apiVersion": "v2", "kind": "X"}, "AgentConfig")) == 2


@pytest.mark.parametrize("content", [
    b"cards: &c [{model: T4, memoryMiB: 15360}]\nboards: *c\n",
    b"cards: [{model: \xff}]\n",
    b"cards: " + b"[" * 5000 + b"]" * 5000 + b"\n",
])
def test_the_fake_inventory_is_read_by_the_same_loader(tmp_path: Path, content: bytes) -> None:
    """The fake backend's inventory is the agent's YAML too (re-read by its health thread): a
    hostile one is a BackendError naming the file, not a crash or a hang."""
    from elastic_gpu.agent.backends.base import BackendError
    from elastic_gpu.agent.backends.fake import FakeBackend

    path = tmp_path / "inv.yaml"
    path.write_bytes(content)
    with pytest.raises(BackendError, match=f"the fake inventory {path}: not valid YAML"):
        FakeBackend.from_file(path)


def test_dump_yaml_writes_what_read_yaml_reads() -> None:
    from elastic_gpu.api.config.strict_yaml import dump_yaml

    card = {"model": "A100", "memoryMiB": 81920}
    data = {"cards": [card, card], "ratio": 1e-05, "name": "yes"}
    assert "&" not in dump_yaml(data) and "*" not in dump_yaml(data)
    assert read_yaml(dump_yaml(data)) == data
