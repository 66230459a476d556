"""docs/dra.md shows the example manifests of docs/examples/dra/ verbatim (the must-show test
applies those files), and every file is shown."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DOCS = Path(__file__).resolve().parents[3] / "docs"
BLOCK = re.compile(r"<!-- dra-example: (?P<name>[\w.-]+) -->\n```yaml\n(?P<body>.*?)```", re.S)


def test_the_doc_shows_every_example_file_verbatim() -> None:
    text = (DOCS / "dra.md").read_text()
    shown = {m["name"]: m["body"] for m in BLOCK.finditer(text)}
    files = {p.name: p.read_text() for p in (DOCS / "examples" / "dra").glob("*.yaml")}
    assert shown == files
    for body in files.values():
        assert [d for d in yaml.safe_load_all(body) if d]
