"""The README's GPU-claims snippet is the seed README's flow (the manifests the sandbox test
applies verbatim), so what the README shows is what is tested end to end."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from egpu_testing.seed import SEED_CLASS, seed_claim, seed_pod

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_claims_snippet_is_the_tested_seed_flow() -> None:
    match = re.search(r"<<'YAML'\n(.*?)\nYAML\n", README.read_text(), re.S)
    assert match, "README lost its GPU-claims snippet"
    shown = list(yaml.safe_load_all(match.group(1)))
    tested = [yaml.safe_load(SEED_CLASS), yaml.safe_load(seed_claim("gpushare-egpuc-1")),
              yaml.safe_load(seed_pod("test-cuda-1", "gpushare-egpuc-1"))]
    assert shown == tested
