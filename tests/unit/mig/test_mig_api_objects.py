"""The MIGSubstitution CRD: one Python source, the file on disk, the typed rule."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from elastic_gpu.api import migsubstitution as api
from elastic_gpu.api.migsubstitution import MIGSubstitutionError
from elastic_gpu.core.mig.profiles import MIG_MODELS
from elastic_gpu.core.mig.rules import SubstitutionRule
from elastic_gpu.core.resources import MIG_RESOURCE_PATTERN, MigProfile

ROOT = Path(__file__).parents[3]
UID = "6f1c2a3b-0000-4000-8000-0123456789ab"


def test_crd_file_matches_the_code() -> None:
    on_disk = yaml.safe_load((ROOT / "deploy" / "crds" / api.CRD_FILE).read_text())
    assert on_disk == api.crd_manifest(), (
        "regenerate: python -m elastic_gpu.api.migsubstitution --write deploy/crds")


def test_cli_writes_the_file(tmp_path: Path) -> None:
    assert api._main(["--write", str(tmp_path)]) == 0
    assert (tmp_path / api.CRD_FILE).read_text() == (ROOT / "deploy/crds" / api.CRD_FILE).read_text()


def test_profile_pattern_is_the_resource_tables() -> None:
    """The schema accepts exactly the profile names the parser accepts."""
    names = [r.profile.name for m in MIG_MODELS for r in m.profiles]
    names += ["0g.5gb", "1g.05gb", "8g.40gb", "1g.10gb+xx", "1g.10GB", "1g.", "nvidia.com/mig-1g.5gb"]
    for name in names:
        schema_ok = re.match(api.PROFILE_PATTERN, name) is not None
        parser_ok = MIG_RESOURCE_PATTERN.match(f"nvidia.com/mig-{name}") is not None
        assert schema_ok == parser_ok, name


def rule(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "elasticgpu.io/v1alpha", "kind": api.KIND,
            "metadata": {"name": "r", "namespace": "team"}, "spec": spec}


def test_rule_reads_as_served() -> None:
    got = api.rule_from_object(rule(selector={"ownerUID": UID}, fromProfile="1g.10gb",
                                    toProfile="2g.20gb", reason="r"))
    assert got == SubstitutionRule("r", "team", MigProfile.parse("1g.10gb"),
                                   MigProfile.parse("2g.20gb"), UID, None, "r")
    assert got.selects("team", "anything", [UID]) and not got.selects("other", "x", [UID])
    assert not got.selects("team", "x", ["another"])
    saved = {"metadata": {"name": "train-0"}, "spec": {"containers": []}}
    bare = api.rule_from_object(rule(selector={"podName": "train-0"}, fromProfile="1g.10gb",
                                     toProfile="2g.20gb", savedPod=saved))
    assert bare.saved_pod == saved
    assert bare.selects("team", "train-0", []) and not bare.selects("team", "train-1", [])


@pytest.mark.parametrize(("obj", "words"), [
    ({"metadata": {"name": "r", "namespace": "n"}}, "spec is missing"),
    (rule(fromProfile="1g.10gb", toProfile="2g.20gb"), "spec.selector is missing"),
    (rule(selector={}, fromProfile="1g.10gb", toProfile="2g.20gb"), "exactly one of"),
    (rule(selector={"podName": "p"}, fromProfile="1g.10", toProfile="2g.20gb"),
     "spec.fromProfile"),
    (rule(selector={"podName": "p"}, fromProfile="1g.10gb"), "spec.toProfile"),
    (rule(selector={"podName": "p"}, fromProfile="1g.10gb", toProfile="2g.20gb", savedPod=[]),
     "spec.savedPod is not an object"),
])
def test_malformed_rules_name_object_and_field(obj: dict[str, Any], words: str) -> None:
    with pytest.raises(MIGSubstitutionError, match=re.escape(words)) as err:
        api.rule_from_object(obj)
    assert "MIGSubstitution n" in str(err.value) or "MIGSubstitution team/r" in str(err.value)
